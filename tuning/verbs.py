"""tuning's verbs, each parse -> plan -> apply -> report.

The backup file is read, written and removed under one lock per dataDir, held for the
whole verb: an ADD and a DEL (or GC) of the same attachment never interleave.
"""

from __future__ import annotations

import os

from common.attachment import Engine
from common.errors import (
    CHECK_FAILED,
    INVALID_CONFIG,
    KERNEL_FAILURE,
    STATUS_UNAVAILABLE,
    CniError,
)
from common.netns import entered_if_present
from common.result import Result
from common.skel import Request
from common.state import AttachmentStore
from tuning import allowlist, apply, config
from tuning.plan import (
    LOCK_NAME,
    Backup,
    link_differences,
    make_plan,
    originals,
    report,
    sysctl_differences,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.state import Owner


class BackupStore(AttachmentStore):
    """The dataDir comes from the config: never re-moded (chmod 0700 on an existing /tmp or
    /run would break the node), and a directory that is not safe to write is error 7.

    Its files are shared by every network (Go's names), so one without an owner (written
    by Go's tuning) is never stale for GC: its name cannot say which network it is for.
    """

    refusal_code = INVALID_CONFIG
    private = False
    lock_name = LOCK_NAME

    def __init__(self, data_dir: str) -> None:
        super().__init__(data_dir, Backup)

    def load(self, owner: Owner) -> Backup | None:
        # DEL reads before it locks: the dataDir is checked here too, so that a planted
        # file or symlink is refused as what it is.
        self.check()
        backup: Backup | None = super().load(owner)
        return backup


def _kernel(request: Request) -> apply.Kernel:
    """The kernel port the request was handed, else the real kernel's."""
    kernel: apply.Kernel = request.kernel or apply.Kernel()
    return kernel


def add(request: Request) -> Result:
    conf = config.parse(request.conf, request.env, request.environ)
    if conf.sysctls:
        keys = [s.key for s in conf.sysctls]
        allowlist.refuse_unlisted(allowlist.load(conf.allowlist_path), keys)
    plan = make_plan(conf, request.ifname)
    if plan.empty:
        return report(request.conf.prev_result, plan)

    store = BackupStore(conf.data_dir)
    if not plan.link.empty:
        apply.preload_links()
    with (
        Engine(store, request.log).add(request) as change,
        _kernel(request).netns(request.netns) as ns,
    ):
        before = apply.observe(plan, ns)
        backup = originals(plan, before.link, before.sysctls).replace(
            network=request.network, container_id=request.container_id, ifname=request.ifname
        )
        # No undo to hand the engine: apply() puts the namespace back itself when it fails
        # (and raises UndoFailed when it cannot), and the older backup is put back then.
        change.intend(backup.keeping_older(change.previous))
        apply.apply(plan, before, ns)
    request.log.info(
        f"set {len(plan.sysctls)} sysctl(s) and link {plan.link} on {request.ifname}; "
        f"originals in {store.path(store.file_of(request))}"
    )
    return report(request.conf.prev_result, plan)


def delete(request: Request) -> None:
    """Restore the originals and forget them. Succeeds when there is nothing to restore,
    or nothing to restore it in (the namespace or the interface is gone)."""
    store = BackupStore(config.parse_data_dir(request.conf, request.environ))
    ifname = request.ifname
    if not store.has(request):
        return
    peek = store.load(request)  # read again under the lock; this only decides the import
    if peek is not None and not peek.link.empty:
        apply.preload_links()
    kernel = _kernel(request)

    def teardown(backup: Backup | None) -> None:
        if backup is None:
            return  # unreadable garbage: nothing we could restore
        with entered_if_present(request.netns, kernel.netns) as ns:
            failures, refused = ([], []) if ns is None else apply.restore(backup, ifname, ns)
        for problem in refused:
            # Never restorable, so not worth keeping the backup for (see apply.restore).
            request.log.warning(f"DEL cannot put back the original {problem}; forgetting it")
        if failures:
            # The backup stays: the runtime retries DEL, and the originals are still needed.
            raise CniError(
                KERNEL_FAILURE,
                f"could not restore {len(failures)} original value(s) on {ifname}",
                "; ".join(failures),
            )
        request.log.info(
            f"restored originals of {ifname} from {store.path(store.file_of(request))}"
        )

    Engine(store, request.log).delete(request, teardown)


def check(request: Request) -> None:
    conf = config.parse(request.conf, request.env, request.environ)
    plan = make_plan(conf, request.ifname)
    if plan.empty:
        return
    with _kernel(request).netns(request.netns) as ns:
        live = apply.read_sysctls(plan, ns, missing_ok=True)
        problems = sysctl_differences(plan, live)
        if not plan.link.empty:
            link = ns.link(plan.ifname)
            if link is None:
                problems.append(f"there is no interface {plan.ifname}")
            else:
                problems.extend(link_differences(plan.ifname, plan.link, link))
    if problems:
        raise CniError(
            CHECK_FAILED, f"{plan.ifname} does not match the tuning config", "; ".join(problems)
        )


def gc(request: Request) -> None:
    """Forget the backups of this network's attachments the runtime no longer knows."""
    from common.gc import valid_attachments

    data_dir = config.parse_data_dir(request.conf, request.environ)
    valid = valid_attachments(request.conf.body)
    if not os.path.isdir(data_dir):
        return
    with Engine(BackupStore(data_dir), request.log).collecting(request.network, valid):
        pass  # a backup stands for nothing in the kernel: forgetting it is all


def status(request: Request) -> None:
    """Ready when the allowlist parses, dataDir can be written and pyroute2 is there."""
    conf = config.parse(request.conf, request.env, request.environ)
    try:
        allowlist.load(conf.allowlist_path)
    except CniError as e:
        raise CniError(
            STATUS_UNAVAILABLE, f"tuning cannot serve ADDs: {e.msg}", e.details
        ) from None
    existing = conf.data_dir
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CniError(STATUS_UNAVAILABLE, f"tuning cannot write its dataDir {conf.data_dir}")
    if os.path.lexists(conf.data_dir):  # one ADD would refuse (symlink, owner, mode)
        try:
            BackupStore(conf.data_dir).check()
        except CniError as e:
            raise CniError(
                STATUS_UNAVAILABLE, f"tuning cannot serve ADDs: {e.msg}", e.details
            ) from None
    import importlib.util

    if importlib.util.find_spec("pyroute2") is None:
        raise CniError(STATUS_UNAVAILABLE, "pyroute2 is not installed; tuning cannot set links")
