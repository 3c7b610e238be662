"""tuning's verbs, each parse -> plan -> apply -> report.

The backup file is read, written and removed under one lock per dataDir, held for the
whole verb: an ADD and a DEL (or GC) of the same attachment never interleave.

A config with nothing to tune passes prevResult through on ADD: this module imports only
what that needs (the config and the plan), each verb the rest once it has work to do.
"""

from __future__ import annotations

from common.errors import CHECK_FAILED, IO_FAILURE, KERNEL_FAILURE, STATUS_UNAVAILABLE, CniError
from tuning import config
from tuning.plan import make_plan, report

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.result import Result
    from common.skel import Request
    from tuning.backup import Backup
    from tuning.plan import Plan
    from tuning.ports import Kernel


def _kernel(request: Request) -> Kernel:
    from tuning import apply

    kernel: Kernel = request.kernel or apply.Kernel()
    return kernel


def add(request: Request) -> Result:
    conf = config.parse(request.conf, request.env, request.environ)
    if conf.sysctls:
        keys = [s.key for s in conf.sysctls]
        config.refuse_unlisted(config.load_allowlist(conf.allowlist_path), keys)
    plan = make_plan(conf, request.ifname)
    if plan.empty:
        return report(request.conf.prev_result, plan)
    from common.attachment import Engine
    from tuning import apply
    from tuning.backup import BackupStore, originals

    store = BackupStore(conf.data_dir)
    if not plan.link.empty:
        apply.preload_links()
    with (
        Engine(store, request.log).add(request.attachment) as change,
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
        f"set on {request.ifname}: {describe(plan)}; "
        f"originals kept in {store.path(store.file_of(request.attachment))}"
    )
    return report(request.conf.prev_result, plan)


def describe(plan: Plan) -> str:
    """What ADD sets, as an operator reads it: 'mac 02:..., mtu 1400, sysctl
    net/ipv4/conf/eth0/accept_redirects=0'."""
    link = [
        f"{option.key} {getattr(plan.link, option.field)}"
        for option in config.LINK_OPTIONS
        if getattr(plan.link, option.field) is not None
    ]
    # The /proc/sys path, not a dotted key: an interface name may hold a dot (eth0.100).
    sysctls = [f"sysctl {w.path}={w.value}" for w in plan.sysctls]
    return ", ".join(link + sysctls) or "nothing"


def delete(request: Request) -> None:
    """Restore the originals and forget them. Succeeds when there is nothing to restore,
    or nothing to restore it in (the namespace or the interface is gone)."""
    from tuning.backup import BackupStore

    store = BackupStore(config.parse_data_dir(request.conf, request.environ))
    ifname = request.ifname
    if not store.has(request.attachment):
        return
    from common.attachment import Engine
    from common.netns import entered_if_present
    from tuning import apply

    peek = store.load(request.attachment)  # read again under the lock; this only decides the import
    if peek is not None and not peek.link.empty:
        apply.preload_links()

    def teardown(backup: Backup | None) -> None:
        if backup is None:
            return  # unreadable garbage: nothing we could restore
        with entered_if_present(request.netns, _kernel(request).netns) as ns:
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
            f"restored originals of {ifname} from {store.path(store.file_of(request.attachment))}"
        )

    Engine(store, request.log).delete(request.attachment, teardown)


def check(request: Request) -> None:
    conf = config.parse(request.conf, request.env, request.environ)
    plan = make_plan(conf, request.ifname)
    if plan.empty:
        return
    from tuning import apply
    from tuning.plan import link_differences, sysctl_differences

    with _kernel(request).netns(request.netns) as ns:
        live = apply.read_sysctls(plan, ns, missing_ok=True)
        problems = sysctl_differences(plan, live)
        if not plan.link.empty:
            link = apply.read_link(ns, plan.ifname)
            problems.extend(link_differences(plan.ifname, plan.link, link))
    if problems:
        raise CniError(
            CHECK_FAILED, f"{plan.ifname} does not match the tuning config", "; ".join(problems)
        )


def gc(request: Request) -> None:
    """Forget the backups of this network's attachments the runtime no longer knows."""
    import os

    from common.attachment import Engine
    from common.gc import valid_attachments
    from tuning.backup import BackupStore

    data_dir = config.parse_data_dir(request.conf, request.environ)
    valid = valid_attachments(request.network, request.conf.body)
    if not os.path.isdir(data_dir):
        return
    with Engine(BackupStore(data_dir), request.log).collecting(request.network, valid):
        pass  # a backup stands for nothing in the kernel: forgetting it is all


def status(request: Request) -> None:
    """Ready when the allowlist parses, dataDir can be written and pyroute2 is there."""
    import os

    from tuning.backup import BackupStore

    conf = config.parse(request.conf, request.env, request.environ)
    existing = conf.data_dir
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    try:
        config.load_allowlist(conf.allowlist_path)
        if not os.access(existing, os.W_OK | os.X_OK):
            raise CniError(IO_FAILURE, f"cannot write its dataDir {conf.data_dir}")
        if os.path.lexists(conf.data_dir):  # one ADD would refuse (symlink, owner, mode)
            BackupStore(conf.data_dir).check()
    except CniError as e:
        raise CniError(
            STATUS_UNAVAILABLE, f"tuning cannot serve ADDs: {e.msg}", e.details
        ) from None
    import importlib.util

    if importlib.util.find_spec("pyroute2") is None:
        raise CniError(STATUS_UNAVAILABLE, "pyroute2 is not installed; tuning cannot set links")
