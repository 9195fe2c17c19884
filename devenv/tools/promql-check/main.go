// Command promql-check parses PromQL expressions with Prometheus's own parser.
//
// It reads a JSON list of expressions from stdin and prints, for each, one JSON
// object {"expr": ..., "metrics": [...], "error": ...}: the metric names its
// selectors use (from __name__ matchers too) or the parser's error.  It exits 1
// when any expression does not parse.  Built by devenv/build-tools.sh.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type verdict struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics"`
	Error   string   `json:"error,omitempty"`
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var exprs []string
	if err := json.Unmarshal(data, &exprs); err != nil {
		fail(fmt.Errorf("stdin must be a JSON list of strings: %w", err))
	}
	out := make([]verdict, 0, len(exprs))
	bad := false
	// The defaults of a Prometheus server: stable functions only.
	promql := parser.NewParser(parser.Options{})
	for _, text := range exprs {
		v := verdict{Expr: text, Metrics: []string{}}
		expr, err := promql.ParseExpr(text)
		if err != nil {
			v.Error = err.Error()
			bad = true
		} else {
			v.Metrics = metricNames(expr)
		}
		out = append(out, v)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fail(err)
	}
	if bad {
		os.Exit(1)
	}
}

// metricNames lists the metric names the expression's vector selectors select.
func metricNames(expr parser.Expr) []string {
	seen := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if vs.Name != "" {
			seen[vs.Name] = true
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual && m.Value != "" {
				seen[m.Value] = true
			}
		}
		return nil
	})
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "promql-check:", err)
	os.Exit(2)
}
