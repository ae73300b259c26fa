// The cluster DNS of the test node: CoreDNS, as its own coredns.go builds
// it, with the plugins a kubeadm cluster's Corefile names (kubernetes,
// errors, health, ready, cache, loop, loadbalance, log, reload) and
// nothing else. The plugin order is CoreDNS's own (its directive list),
// not the order of these imports.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
