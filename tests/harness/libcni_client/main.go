// libcni-client: the test suites' CNI runtime, a command-line front end to libcni (the
// library containerd, CRI-O and podman call), with upstream cnitool's arguments:
//
//	libcni-client add|check|del NETWORK NETNS
//
// NETWORK is the "name" of a conflist in $NETCONFPATH (default /etc/cni/net.d). The rest of
// the runtime's input comes from the environment, as cnitool takes it:
//
//	CNI_PATH         plugin search path (colon-separated)
//	CNI_IFNAME       interface name in the container (default eth0)
//	CNI_ARGS         "K1=V1;K2=V2" (libcni passes them on as CNI_ARGS)
//	CAP_ARGS         JSON object of capability arguments (portMappings, bandwidth, mac, ...)
//	CNI_CONTAINERID  container id (default: cnitool's, derived from the netns path)
//
// add prints the chain's result on stdout. Any failure is one line on stderr and exit 1.
// Built by build.sh against Debian's golang-github-appc-cni-dev, offline.
package main

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

const usage = "usage: libcni-client add|check|del NETWORK NETNS"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "libcni-client:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 3 {
		return errors.New(usage)
	}
	verb, network, netnsArg := args[0], args[1], args[2]

	confDir := envOr("NETCONFPATH", "/etc/cni/net.d")
	list, err := libcni.LoadConfList(confDir, network)
	if err != nil {
		return fmt.Errorf("network %q in %s: %w", network, confDir, err)
	}
	netns, err := filepath.Abs(netnsArg)
	if err != nil {
		return err
	}
	rt, err := runtimeConf(netns)
	if err != nil {
		return err
	}

	cni := libcni.NewCNIConfig(filepath.SplitList(os.Getenv("CNI_PATH")), nil)
	ctx := context.Background()
	switch verb {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if result != nil {
			// libcni returns what the chain produced even when a later step failed.
			if perr := result.Print(); perr != nil && err == nil {
				err = perr
			}
		}
		return err
	case "check":
		return cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return cni.DelNetworkList(ctx, list, rt)
	}
	return fmt.Errorf("unknown verb %q; %s", verb, usage)
}

// runtimeConf collects the runtime's side of the call from the environment.
func runtimeConf(netns string) (*libcni.RuntimeConf, error) {
	rt := &libcni.RuntimeConf{
		ContainerID: os.Getenv("CNI_CONTAINERID"),
		NetNS:       netns,
		IfName:      envOr("CNI_IFNAME", "eth0"),
	}
	if rt.ContainerID == "" {
		// cnitool's default, so a bare call names the same container as cnitool would.
		sum := sha512.Sum512([]byte(netns))
		rt.ContainerID = "cnitool-" + hex.EncodeToString(sum[:10])
	}
	if raw := os.Getenv("CNI_ARGS"); raw != "" {
		for _, item := range strings.Split(raw, ";") {
			key, value, found := strings.Cut(item, "=")
			if !found || key == "" {
				return nil, fmt.Errorf("CNI_ARGS: %q is not KEY=VALUE", item)
			}
			rt.Args = append(rt.Args, [2]string{key, value})
		}
	}
	if raw := os.Getenv("CAP_ARGS"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &rt.CapabilityArgs); err != nil {
			return nil, fmt.Errorf("CAP_ARGS is not a JSON object: %w", err)
		}
	}
	return rt, nil
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}
