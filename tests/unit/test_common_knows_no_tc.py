"""common/ is CNI plumbing: it carries rtnetlink messages but knows no tc kind. The
qdiscs and filters bandwidth sends (tbf, ingress, u32 with mirred actions) and the
pyroute2 modules that encode them are bandwidth's (bandwidth.tc.tc_modules)."""

from __future__ import annotations

import re
from pathlib import Path

COMMON = Path(__file__).resolve().parents[2] / "common"
TC_WORDS = re.compile(r"\b(tbf|u32|mirred|tcmsg|sched_\w+|cls_\w+)\b", re.IGNORECASE)


def test_common_names_no_tc_kind_nor_pyroute2_tc_module() -> None:
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(COMMON.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if TC_WORDS.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_pattern_finds_what_common_used_to_hold() -> None:
    assert TC_WORDS.search('kinds = {"tbf": sched_tbf, "ingress": sched_ingress, "u32": cls_u32}')
