// Command kstatus-check prints the kstatus verdict of one Kubernetes object.
//
// It reads the object as JSON from stdin (or the file named as its only argument),
// computes its status with sigs.k8s.io/cli-utils/pkg/kstatus/status (the library
// Flux, kpt and `kubectl wait`-style tools use) and prints one JSON line:
// {"status": "Current", "message": "..."}.  Built by devenv/build-tools.sh.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	in := io.Reader(os.Stdin)
	if len(os.Args) == 2 {
		f, err := os.Open(os.Args[1])
		if err != nil {
			fail(err)
		}
		defer f.Close()
		in = f
	} else if len(os.Args) > 2 {
		fail(fmt.Errorf("usage: kstatus-check [FILE]"))
	}
	data, err := io.ReadAll(in)
	if err != nil {
		fail(err)
	}
	// Unstructured's own decoding keeps integers int64, as the API machinery expects.
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		fail(fmt.Errorf("not a Kubernetes object: %w", err))
	}
	result, err := status.Compute(obj)
	if err != nil {
		fail(err)
	}
	out, _ := json.Marshal(map[string]string{
		"status":  result.Status.String(),
		"message": result.Message,
	})
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus-check:", err)
	os.Exit(1)
}
