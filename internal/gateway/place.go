package gateway

import "math/rand/v2"

// candidate is a host that could take a new session.
type candidate struct {
	name string
	free int // slots left, as last reported plus this gateway's placements since
}

// choose picks the better of two randomly chosen candidates by free slots
// ("the power of two choices": load stays near even without every
// gateway agreeing on one global view, and no herd piles onto the single
// emptiest host after each health round). It returns -1 if none has a
// free slot.
func choose(cands []candidate, rnd *rand.Rand) int {
	var open []int
	for i, c := range cands {
		if c.free > 0 {
			open = append(open, i)
		}
	}
	switch len(open) {
	case 0:
		return -1
	case 1:
		return open[0]
	}
	a := rnd.IntN(len(open))
	b := rnd.IntN(len(open) - 1)
	if b >= a {
		b++
	}
	ia, ib := open[a], open[b]
	if cands[ib].free > cands[ia].free {
		return ib
	}
	return ia
}
