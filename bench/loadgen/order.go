package main

import (
	"flag"
	"fmt"
	"strings"
)

// roundOrder is the order in which round r runs n routes: row r of a
// Williams design. A plain rotation (ABCD, BCDA, ...) keeps every route
// behind the same neighbour in every round, so whatever one route leaves
// behind (a heap near its collection, a warm or thrashed cache, a Redis
// busy expiring keys) falls on the same next route each time and never
// averages out of the paired ratios. In a Williams design every route
// follows every other equally often: over n rounds when n is even, over
// 2n (the rows mirrored in the second half) when n is odd; and each route
// runs once in every position over those rounds, as in a rotation.
func roundOrder(n, r int) []int {
	order := make([]int, n)
	// first row 0, 1, n-1, 2, n-2, ...; row r adds r to each
	for i := range n {
		var v int
		switch {
		case i == 0:
			v = 0
		case i%2 == 1:
			v = (i + 1) / 2
		default:
			v = n - i/2
		}
		order[i] = (v + r) % n
	}
	if n%2 == 1 && (r/n)%2 == 1 {
		for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
			order[i], order[j] = order[j], order[i]
		}
	}
	return order
}

// orderCmd prints roundOrder(n, round), space-separated, for
// bench/compare.sh, so that its rounds follow the same design.
func orderCmd(args []string) error {
	fs := flag.NewFlagSet("order", flag.ExitOnError)
	n := fs.Int("n", 0, "number of runs in a round")
	round := fs.Int("round", 0, "round, from 0")
	_ = fs.Parse(args)
	if *n < 1 || *round < 0 {
		return fmt.Errorf("order: -n must be at least 1 and -round not negative")
	}
	fmt.Println(strings.Trim(fmt.Sprint(roundOrder(*n, *round)), "[]"))
	return nil
}
