package main

import (
	"path/filepath"
	"testing"
)

// A run at a single concurrency leaves the log-scale axis no range of its
// own; the chart must still draw (it panicked before it got one).
func TestChartOfOneConcurrency(t *testing.T) {
	for _, conc := range []int{1, 32} {
		cells := map[caseKey]map[string]*cell{{"new", conc}: {"proxy": {rps: 1000, p99: 900}}}
		path := filepath.Join(t.TempDir(), "chart.png")
		if err := chart(path, cells, []string{"new"}, []string{"proxy"}, []int{conc}, nil); err != nil {
			t.Fatalf("c=%d: %v", conc, err)
		}
	}
}

func TestQuantile(t *testing.T) {
	v := []float64{4, 1, 3, 2}
	for q, want := range map[float64]float64{0: 1, 0.25: 1.75, 0.5: 2.5, 0.75: 3.25, 1: 4} {
		if got := quantile(v, q); got != want {
			t.Errorf("quantile(%v, %v) = %v, want %v", v, q, got, want)
		}
	}
}
