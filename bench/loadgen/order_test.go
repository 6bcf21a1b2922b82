package main

import "testing"

// Over a full cycle of rounds (n for an even number of routes, 2n for an
// odd one), each round is a permutation, every route runs once in every
// position per n rounds, and every ordered pair of routes is adjacent
// equally often: once per n rounds.
func TestRoundOrderIsBalanced(t *testing.T) {
	for n := 1; n <= 11; n++ {
		cycle := n
		if n%2 == 1 {
			cycle = 2 * n
		}
		follows := map[[2]int]int{}
		position := map[[2]int]int{}
		for r := range cycle {
			order := roundOrder(n, r)
			seen := make([]bool, n)
			for i, v := range order {
				if v < 0 || v >= n || seen[v] {
					t.Fatalf("n=%d round %d: %v is not a permutation", n, r, order)
				}
				seen[v] = true
				position[[2]int{v, i}]++
				if i > 0 {
					follows[[2]int{order[i-1], v}]++
				}
			}
		}
		for a := range n {
			for i := range n {
				if got := position[[2]int{a, i}]; got != cycle/n {
					t.Errorf("n=%d: route %d ran %d times at position %d over %d rounds, want %d", n, a, got, i, cycle, cycle/n)
				}
			}
			for b := range n {
				if a == b {
					continue
				}
				if got := follows[[2]int{a, b}]; got != cycle/n {
					t.Errorf("n=%d: route %d followed route %d %d times over %d rounds, want %d", n, b, a, got, cycle, cycle/n)
				}
			}
		}
	}
}
