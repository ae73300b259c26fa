// pause is the test node's pod sandbox image: the process that holds a
// pod's namespaces while its containers come and go, as Kubernetes's own
// pause does. It waits for SIGINT or SIGTERM and exits 0; as PID 1 of the
// pod it also reaps the orphans a shared process namespace hands it (Go's
// runtime waits for none, so reap them here).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
