"""The fakes implement the declared kernel ports, and so do the host's ports, neither
inheriting from the other: a method added to a host port must be declared in the
plugin's ports.py, and a fake that lacks a declared method fails here (and mypy, through
the annotations below) instead of reaching the real kernel through a base class."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from bandwidth import ports as bandwidth_ports
from bandwidth import tc
from common import libnftables
from portmap import kernel as portmap_kernel
from portmap import ports as portmap_ports
from tests.harness.fake_kernel import (
    FLAG_WORDS,
    LINK_ATTRIBUTES,
    FakeBandwidthKernel,
    FakeContainerNetns,
    FakeKernel,
    FakeTuningKernel,
)
from tests.harness.fake_portmap import FakeNetfilter, FakeNft, FakeNftContext, FakeXtables
from tuning import apply
from tuning import ports as tuning_ports

# (the declared port, the host's implementation, the fake)
PORTS = [
    (bandwidth_ports.Kernel, tc.Kernel, FakeBandwidthKernel),
    (tuning_ports.Kernel, apply.Kernel, FakeTuningKernel),
    (tuning_ports.ContainerNetns, apply.ContainerNetns, FakeContainerNetns),
    (portmap_ports.Kernel, portmap_kernel.Kernel, FakeNetfilter),
    (portmap_ports.NftKernel, portmap_kernel.NftKernel, FakeNft),
    (portmap_ports.XtablesKernel, portmap_kernel.XtablesKernel, FakeXtables),
    (portmap_ports.NftContext, libnftables.Context, FakeNftContext),
]
IDS = [f"{p.__module__}.{p.__name__}" for p, _, _ in PORTS]
CONTEXT = ("__enter__", "__exit__")  # the with-block a port may be


def declared(port: type) -> set[str]:
    """The port's methods and properties, as its Protocol declares them."""
    return {n for n in vars(port) if not n.startswith("_") or n in CONTEXT}


def methods(cls: type) -> set[str]:
    """The public methods a class defines (or inherits from a class other than object)."""
    return {
        name
        for name, member in inspect.getmembers(cls, callable)
        if (not name.startswith("_") or name in CONTEXT) and member is not getattr(object, name, 0)
    }


@pytest.mark.parametrize(("port", "host", "fake"), PORTS, ids=IDS)
def test_the_host_and_the_fake_implement_the_declared_port_without_inheriting(
    port: type, host: type, fake: type
) -> None:
    assert object in fake.__bases__ and len(fake.__mro__) == 2, fake.__mro__  # inherits nothing
    assert host not in fake.__mro__ and fake not in host.__mro__
    properties = {n for n in declared(port) if isinstance(vars(port)[n], property)}
    calls = declared(port) - properties
    assert methods(host) == calls, "declare every method of the host's port in its ports.py"
    missing = calls - methods(fake)
    assert not missing, f"{fake.__name__} lacks {sorted(missing)}"


def test_a_port_missing_a_method_is_caught() -> None:
    """The comparison above fails for a fake without a declared method (it is not vacuous)."""

    class Incomplete:
        def rtnl(self, netns: str = "") -> Any:
            raise AssertionError("not called")

    assert declared(bandwidth_ports.Kernel) - methods(Incomplete) == {"has_device"}


def test_the_fakes_are_typed_as_the_ports(tmp_path: Path) -> None:
    """What mypy checks (the annotations), and the properties a Protocol declares."""
    kernel = FakeKernel(tmp_path / "netns")
    netfilter = FakeNetfilter()
    bandwidth: bandwidth_ports.Kernel = FakeBandwidthKernel(kernel)
    tuning: tuning_ports.Kernel = FakeTuningKernel(kernel)
    netns: tuning_ports.ContainerNetns = tuning.netns(kernel.add_netns("ctr"))
    portmap: portmap_ports.Kernel = netfilter
    nft: portmap_ports.NftKernel = portmap.nft
    xtables: portmap_ports.XtablesKernel = portmap.xtables
    context: portmap_ports.NftContext = nft.context()
    assert bandwidth.has_device("lo") and not bandwidth.has_device("eth0")
    with netns as entered:
        assert entered.rtnl().link("lo") is not None
    assert (nft.usable(), xtables.host_variant()) == (True, "nft")
    assert context.run("list tables")[0] == 0
    # the host's ports, as the verbs take them (made, not used: no kernel is asked)
    hosts: tuple[bandwidth_ports.Kernel, tuning_ports.Kernel, portmap_ports.Kernel] = (
        tc.Kernel(),
        apply.Kernel(),
        portmap_kernel.Kernel(),
    )
    assert isinstance(hosts[2].nft, portmap_kernel.NftKernel)


def test_the_fake_link_keeps_every_attribute_tunings_port_sets() -> None:
    """A tuning link option is three edits (config.LINK_OPTIONS, the port's ATTRIBUTES or
    FLAGS, the fake's LINK_ATTRIBUTES); the fake derives the rest from its table."""
    carried = {nla for nla, _ in apply.ATTRIBUTES.values()}
    assert carried <= set(LINK_ATTRIBUTES), "give the new attribute a line in LINK_ATTRIBUTES"
    assert {word for _, word in FLAG_WORDS} >= set(apply.FLAGS)
