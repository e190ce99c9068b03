package network

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// span is an inclusive IPv4 range.
type span struct{ lo, hi uint32 }

func u32(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func be(v uint32) []byte { b := make([]byte, 4); binary.BigEndian.PutUint32(b, v); return b }

// merge turns IPv4 prefixes into sorted, disjoint ranges: an interval set
// refuses overlapping elements, and operators' lists overlap (a pool
// inside 10/8, an address inside a denied subnet).
func merge(ps []netip.Prefix) []span {
	var out []span
	for _, p := range ps {
		if !p.IsValid() || !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		lo := u32(p.Addr())
		out = append(out, span{lo, lo | uint32(uint64(1)<<(32-p.Bits())-1)})
	}
	slices.SortFunc(out, func(a, b span) int { return int(int64(a.lo) - int64(b.lo)) })
	n := 0
	for _, s := range out {
		if n > 0 && uint64(s.lo) <= uint64(out[n-1].hi)+1 {
			out[n-1].hi = max(out[n-1].hi, s.hi)
			continue
		}
		out[n] = s
		n++
	}
	return out[:n]
}

// intervalElements are an interval set's elements for ps: each range's
// first address, and the address after its last as an interval end
// (none after 255.255.255.255).
func intervalElements(ps []netip.Prefix) []nftables.SetElement {
	var els []nftables.SetElement
	for _, s := range merge(ps) {
		els = append(els, nftables.SetElement{Key: be(s.lo)})
		if s.hi != ^uint32(0) {
			els = append(els, nftables.SetElement{Key: be(s.hi + 1), IntervalEnd: true})
		}
	}
	return els
}

func netipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}
