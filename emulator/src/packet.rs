//! A frame travelling through the emulator, and byte-level helpers.

/// Size of `struct virtio_net_hdr` (PACKET_VNET_HDR).
pub const VNET_HDR_LEN: usize = 10;
pub const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
pub const VIRTIO_NET_HDR_F_DATA_VALID: u8 = 2;
pub const ETH_HLEN: usize = 14;

// virtio_net_hdr.gso_type values (include/uapi/linux/virtio_net.h).
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_UDP_L4: u8 = 5;
pub const GSO_ECN: u8 = 0x80;

#[derive(Debug)]
pub struct Packet {
    /// The Ethernet frame (header + payload, no FCS); for an offloaded frame,
    /// the headers once and the payload of all its segments.
    pub data: Vec<u8>,
    /// virtio_net_hdr the kernel gave us (checksum-offload and segmentation state).
    pub vnet: [u8; VNET_HDR_LEN],
    /// Arrival time (ns, CLOCK_MONOTONIC).
    pub arrival: u64,
    /// Skip delay and jitter (netem reorder).
    pub skip_delay: bool,
    /// Segments on the wire: 1, or the count of an offloaded (GSO) frame.
    pub segs: u32,
    /// Of an offloaded frame: Ethernet + IP + TCP/UDP header bytes, repeated in each segment.
    pub hdr_len: u16,
}

impl Packet {
    pub fn new(data: Vec<u8>) -> Self {
        Packet { data, vnet: [0; VNET_HDR_LEN], arrival: 0, skip_delay: false, segs: 1, hdr_len: 0 }
    }
    #[inline]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Bytes on the wire: every segment's frame, headers included (a 64 KB
    /// offloaded TCP frame is 45 frames of up to 1514 bytes).
    #[inline]
    pub fn wire_len(&self) -> u64 {
        self.data.len() as u64 + (self.segs as u64 - 1) * self.hdr_len as u64
    }
    #[inline]
    pub fn gso_type(&self) -> u8 {
        self.vnet[1] & !GSO_ECN
    }
    #[inline]
    pub fn gso_size(&self) -> usize {
        u16::from_le_bytes([self.vnet[4], self.vnet[5]]) as usize
    }
    /// A copy with its own buffer (duplicates).
    pub fn duplicate(&self) -> Packet {
        Packet { data: self.data.clone(), skip_delay: false, ..*self }
    }

    /// Read the segmentation state the kernel gave (PACKET_VNET_HDR). Sets
    /// `segs` and `hdr_len` of a TCP (v4/v6) or UDP (USO) offloaded frame;
    /// returns false for one this emulator cannot segment (UFO, unknown
    /// headers), which the caller drops.
    pub fn parse_gso(&mut self) -> bool {
        self.segs = 1;
        self.hdr_len = 0;
        let t = self.gso_type();
        if t == GSO_NONE {
            return true;
        }
        let Some(hdr) = l4_header_end(&self.data, t) else { return false };
        let size = self.gso_size();
        if size == 0 || hdr >= self.data.len() {
            return false;
        }
        let payload = self.data.len() - hdr;
        self.segs = payload.div_ceil(size) as u32;
        self.hdr_len = hdr as u16;
        if self.segs == 1 {
            // One segment: an ordinary frame (its checksum is left to the kernel as before).
            self.clear_gso();
        }
        true
    }

    fn clear_gso(&mut self) {
        self.vnet[1] = GSO_NONE;
        self.vnet[2..6].fill(0);
        self.segs = 1;
        self.hdr_len = 0;
    }
}

/// A frame's flow as fair queueing tells flows apart: the IP version's source
/// and destination addresses, the protocol and (TCP, UDP) the ports, as bytes;
/// a frame that is not IP is a flow of its own ethertype. Extension headers of
/// IPv6 are not followed (the lab's traffic carries none).
pub fn flow_key(d: &[u8]) -> Vec<u8> {
    let mut off = ETH_HLEN;
    let mut ethertype = match (d.get(12), d.get(13)) {
        (Some(a), Some(b)) => u16::from_be_bytes([*a, *b]),
        _ => return Vec::new(),
    };
    if ethertype == 0x8100 || ethertype == 0x88a8 {
        ethertype = match (d.get(16), d.get(17)) {
            (Some(a), Some(b)) => u16::from_be_bytes([*a, *b]),
            _ => return ethertype.to_be_bytes().to_vec(),
        };
        off += 4;
    }
    let (proto, addrs, l4) = match ethertype {
        0x0800 if d.len() >= off + 20 => {
            let ihl = (d[off] & 0x0f) as usize * 4;
            (d[off + 9], off + 12..off + 20, off + ihl)
        }
        0x86dd if d.len() >= off + 40 => (d[off + 6], off + 8..off + 40, off + 40),
        _ => return ethertype.to_be_bytes().to_vec(),
    };
    let mut key = Vec::with_capacity(38);
    key.extend_from_slice(&ethertype.to_be_bytes());
    key.push(proto);
    key.extend_from_slice(&d[addrs]);
    if matches!(proto, 6 | 17) {
        if let Some(ports) = d.get(l4..l4 + 4) {
            key.extend_from_slice(ports);
        }
    }
    key
}

/// Offset of the first payload byte after Ethernet (+ one VLAN tag), IPv4/IPv6
/// and TCP/UDP headers, for gso_type `t`; None when the headers don't match it.
fn l4_header_end(d: &[u8], t: u8) -> Option<usize> {
    let mut off = ETH_HLEN;
    let mut ethertype = u16::from_be_bytes([*d.get(12)?, *d.get(13)?]);
    if ethertype == 0x8100 || ethertype == 0x88a8 {
        ethertype = u16::from_be_bytes([*d.get(16)?, *d.get(17)?]);
        off += 4;
    }
    let proto = match ethertype {
        0x0800 => {
            let ihl = (*d.get(off)? & 0x0f) as usize * 4;
            let proto = *d.get(off + 9)?;
            off += ihl;
            proto
        }
        // Extension headers are not followed: the kernel's own GSO frames carry none.
        0x86dd => {
            let proto = *d.get(off + 6)?;
            off += 40;
            proto
        }
        _ => return None,
    };
    match (t, proto) {
        (GSO_TCPV4 | GSO_TCPV6, 6) => Some(off + (*d.get(off + 12)? >> 4) as usize * 4),
        (GSO_UDP_L4, 17) => Some(off + 8),
        _ => None,
    }
}

/// Split an offloaded frame into the frames its segments would have been on
/// the wire, as the kernel's GSO does: per segment, IPv4 total length, ID and
/// header checksum, IPv6 payload length, TCP sequence number and flags (CWR
/// on the first only, FIN and PSH on the last only) or UDP length. The L4
/// checksum stays offloaded (NEEDS_CSUM), with the pseudo-header sum of the
/// segment's own length in its field, so the kernel completes it on the way
/// out. Buffers come from `alloc`; `p`'s own buffer goes to `recycle`.
pub fn segment(p: Packet, alloc: &mut impl FnMut() -> Vec<u8>, recycle: &mut Vec<Vec<u8>>, out: &mut Vec<Packet>) {
    if p.segs <= 1 {
        out.push(p);
        return;
    }
    let hdr = p.hdr_len as usize;
    let size = p.gso_size();
    let tcp = p.gso_type() != GSO_UDP_L4;
    let l2 = if u16::from_be_bytes([p.data[12], p.data[13]]) == 0x8100
        || u16::from_be_bytes([p.data[12], p.data[13]]) == 0x88a8
    {
        ETH_HLEN + 4
    } else {
        ETH_HLEN
    };
    let v4 = p.data[l2] >> 4 == 4;
    let l4 = if v4 { l2 + (p.data[l2] & 0x0f) as usize * 4 } else { l2 + 40 };
    let payload = &p.data[hdr..];
    let n = p.segs as usize;
    let seq0 = if tcp { u32::from_be_bytes(p.data[l4 + 4..l4 + 8].try_into().unwrap()) } else { 0 };
    let id0 = if v4 { u16::from_be_bytes([p.data[l2 + 4], p.data[l2 + 5]]) } else { 0 };
    for (i, chunk) in payload.chunks(size).enumerate() {
        let mut d = alloc();
        d.clear();
        d.extend_from_slice(&p.data[..hdr]);
        d.extend_from_slice(chunk);
        let l4_len = (hdr - l4 + chunk.len()) as u16;
        if v4 {
            let total = (hdr - l2 + chunk.len()) as u16;
            d[l2 + 2..l2 + 4].copy_from_slice(&total.to_be_bytes());
            d[l2 + 4..l2 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
            d[l2 + 10..l2 + 12].fill(0);
            let c = csum_fold(csum_partial(&d[l2..l4], 0));
            d[l2 + 10..l2 + 12].copy_from_slice(&c.to_be_bytes());
        } else {
            d[l2 + 4..l2 + 6].copy_from_slice(&l4_len.to_be_bytes());
        }
        let check_at = if tcp {
            d[l4 + 4..l4 + 8].copy_from_slice(&seq0.wrapping_add((i * size) as u32).to_be_bytes());
            const FIN: u8 = 0x01;
            const PSH: u8 = 0x08;
            const CWR: u8 = 0x80;
            if i + 1 < n {
                d[l4 + 13] &= !(FIN | PSH);
            }
            if i > 0 {
                d[l4 + 13] &= !CWR;
            }
            l4 + 16
        } else {
            d[l4 + 4..l4 + 6].copy_from_slice(&l4_len.to_be_bytes());
            l4 + 6
        };
        // Pseudo-header sum, not inverted: what the kernel leaves in the field of a NEEDS_CSUM frame.
        let mut sum = csum_partial(if v4 { &d[l2 + 12..l2 + 20] } else { &d[l2 + 8..l2 + 40] }, 0);
        sum += (if tcp { 6u64 } else { 17 }) + l4_len as u64;
        let pseudo = !csum_fold(sum);
        d[check_at..check_at + 2].copy_from_slice(&pseudo.to_be_bytes());
        let mut s = Packet::new(d);
        s.vnet = p.vnet;
        s.vnet[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
        s.vnet[1] = GSO_NONE;
        s.vnet[2..6].fill(0);
        s.vnet[6..8].copy_from_slice(&(l4 as u16).to_le_bytes());
        s.vnet[8..10].copy_from_slice(&(if tcp { 16u16 } else { 6 }).to_le_bytes());
        s.arrival = p.arrival;
        s.skip_delay = p.skip_delay;
        out.push(s);
    }
    recycle.push(p.data);
}

fn csum_partial(data: &[u8], mut sum: u64) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [b] = chunks.remainder() {
        sum += (*b as u64) << 8;
    }
    sum
}

fn csum_fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// If the kernel left the L4 checksum to "hardware" (NEEDS_CSUM), compute it
/// now, like skb_checksum_help, so that a later bit flip is detectable by the
/// receiver as it would be on a wire. `csum_start` counts from the start of
/// the frame. Returns true when a checksum was written.
pub fn finalize_checksum(p: &mut Packet) -> bool {
    if p.vnet[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM == 0 {
        return false;
    }
    let start = u16::from_le_bytes([p.vnet[6], p.vnet[7]]) as usize;
    let off = u16::from_le_bytes([p.vnet[8], p.vnet[9]]) as usize;
    if start >= p.data.len() || start + off + 2 > p.data.len() {
        return false;
    }
    // The field holds the pseudo-header sum (not inverted): summing the whole
    // L4 segment including it and folding gives the final checksum.
    let sum = csum_partial(&p.data[start..], 0);
    let mut c = csum_fold(sum);
    // UDP transmits 0 as 0xffff; harmless for TCP/others too since both are
    // the same value in ones' complement.
    if c == 0 {
        c = 0xffff;
    }
    p.data[start + off..start + off + 2].copy_from_slice(&c.to_be_bytes());
    p.vnet[0] &= !VIRTIO_NET_HDR_F_NEEDS_CSUM;
    p.vnet[6..10].fill(0);
    true
}

/// Flip bit `bit` of the payload after the Ethernet header. Returns false if
/// the frame has no payload.
pub fn flip_payload_bit(p: &mut Packet, bit: u64) -> bool {
    let payload_bits = (p.data.len().saturating_sub(ETH_HLEN) as u64) * 8;
    if payload_bits == 0 {
        return false;
    }
    let b = bit % payload_bits;
    p.data[ETH_HLEN + (b / 8) as usize] ^= 1 << (b % 8);
    // Any "checksum already verified" hint must go: the data changed.
    p.vnet[0] &= !VIRTIO_NET_HDR_F_DATA_VALID;
    true
}

/// An offloaded TCP frame as the kernel hands it over: headers once,
/// `payload` bytes, the pseudo-header sum (with the whole length) in the
/// checksum field, NEEDS_CSUM, gso_type and gso_size set.
#[cfg(test)]
pub(crate) fn offloaded_tcp(v6: bool, payload: usize, gso_size: u16, flags: u8) -> Packet {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    let (l3, gso) = if v6 { (40, GSO_TCPV6) } else { (20, GSO_TCPV4) };
    f.extend_from_slice(if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
    let l4_len = 20 + payload;
    if v6 {
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(l4_len as u16).to_be_bytes());
        f.extend_from_slice(&[6, 64]);
        f.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        let total = (20 + l4_len) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2]);
    }
    let l4 = ETH_HLEN + l3;
    // Ports, seq 0xfffffff0 (wraps), ack, data offset 5, flags, window, check, urgent.
    f.extend_from_slice(&[0x30, 0x39, 0x14, 0x51, 0xff, 0xff, 0xff, 0xf0, 0, 0, 0, 1, 0x50, flags, 0xff, 0xff]);
    f.extend_from_slice(&[0, 0, 0, 0]);
    f.extend((0..payload).map(|i| (i % 251) as u8));
    let src_dst = if v6 { &f[ETH_HLEN + 8..ETH_HLEN + 40] } else { &f[ETH_HLEN + 12..ETH_HLEN + 20] };
    let pseudo = !csum_fold(csum_partial(src_dst, 6 + l4_len as u64));
    f[l4 + 16..l4 + 18].copy_from_slice(&pseudo.to_be_bytes());
    let mut p = Packet::new(f);
    p.vnet[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    p.vnet[1] = gso;
    p.vnet[2..4].copy_from_slice(&((l4 + 20) as u16).to_le_bytes());
    p.vnet[4..6].copy_from_slice(&gso_size.to_le_bytes());
    p.vnet[6..8].copy_from_slice(&(l4 as u16).to_le_bytes());
    p.vnet[8..10].copy_from_slice(&16u16.to_le_bytes());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_matches_reference() {
        // UDP/IPv4 frame with a pseudo-header sum in the checksum field.
        let mut f = vec![0u8; 14];
        f[12] = 0x08;
        let ip: [u8; 20] = [0x45, 0, 0, 32, 0, 0, 0x40, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2];
        f.extend_from_slice(&ip);
        let payload = [1u8, 2, 3, 4];
        let udp_len: u16 = 8 + payload.len() as u16;
        // Pseudo header sum.
        let mut ph = 0u64;
        ph += 0xc612 + 0x0001 + 0xc612 + 0x0002 + 17 + udp_len as u64;
        while ph >> 16 != 0 {
            ph = (ph & 0xffff) + (ph >> 16);
        }
        f.extend_from_slice(&[0x30, 0x39, 0x00, 0x35]);
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&(ph as u16).to_be_bytes());
        f.extend_from_slice(&payload);
        let mut p = Packet::new(f.clone());
        p.vnet[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
        p.vnet[6..8].copy_from_slice(&34u16.to_le_bytes());
        p.vnet[8..10].copy_from_slice(&6u16.to_le_bytes());
        assert!(finalize_checksum(&mut p));
        // Reference: full checksum over pseudo header + UDP with zero field.
        let mut seg = f[34..].to_vec();
        seg[6] = 0;
        seg[7] = 0;
        let mut s = csum_partial(&seg, 0);
        s += 0xc612 + 0x0001 + 0xc612 + 0x0002 + 17 + udp_len as u64;
        let want = csum_fold(s);
        assert_eq!(u16::from_be_bytes([p.data[40], p.data[41]]), want);
        assert_eq!(p.vnet[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM, 0);
        // Verifying: sum over pseudo header + segment = 0xffff.
        let s = csum_partial(&p.data[34..], 0xc612 + 0x0001 + 0xc612 + 0x0002 + 17 + udp_len as u64);
        assert_eq!(csum_fold(s), 0);
    }

    /// The TCP checksum of a finished segment verifies against its own pseudo header.
    fn tcp_checksum_ok(d: &[u8], l3: usize) -> bool {
        let l4 = ETH_HLEN + l3;
        let src_dst = if l3 == 40 { &d[ETH_HLEN + 8..ETH_HLEN + 40] } else { &d[ETH_HLEN + 12..ETH_HLEN + 20] };
        csum_fold(csum_partial(&d[l4..], csum_partial(src_dst, 6 + (d.len() - l4) as u64))) == 0
    }

    #[test]
    fn offloaded_frame_counts_its_segments_and_their_headers() {
        let mut p = offloaded_tcp(false, 64_000, 1448, 0x18);
        assert!(p.parse_gso());
        assert_eq!((p.segs, p.hdr_len), (45, 54)); // 44 full segments of 1448 and one of 288
        assert_eq!(p.wire_len(), 54 * 45 + 64_000);
        // One segment's worth is an ordinary frame.
        let mut one = offloaded_tcp(false, 1000, 1448, 0x18);
        assert!(one.parse_gso());
        assert_eq!((one.segs, one.gso_type()), (1, GSO_NONE));
        // UDP fragmentation offload (gso_type 3) is not something to segment here.
        let mut ufo = offloaded_tcp(false, 3000, 1448, 0x18);
        ufo.vnet[1] = 3;
        assert!(!ufo.parse_gso());
    }

    #[test]
    fn segmenting_gives_the_frames_of_the_wire() {
        for v6 in [false, true] {
            let l3 = if v6 { 40 } else { 20 };
            // PSH|ACK|FIN|CWR on the super-frame.
            let mut p = offloaded_tcp(v6, 3000, 1448, 0x80 | 0x18 | 0x01);
            assert!(p.parse_gso());
            let original = p.data.clone();
            let mut out = vec![];
            let mut recycled = vec![];
            segment(p, &mut Vec::new, &mut recycled, &mut out);
            assert_eq!(out.len(), 3);
            assert_eq!(recycled.len(), 1);
            let mut payload = vec![];
            for (i, s) in out.iter_mut().enumerate() {
                let l4 = ETH_HLEN + l3;
                let size = [1448, 1448, 104][i];
                assert_eq!(s.len(), l4 + 20 + size);
                assert_eq!((s.segs, s.gso_type()), (1, GSO_NONE));
                if v6 {
                    assert_eq!(u16::from_be_bytes([s.data[18], s.data[19]]) as usize, 20 + size);
                } else {
                    assert_eq!(u16::from_be_bytes([s.data[16], s.data[17]]) as usize, 40 + size);
                    assert_eq!(u16::from_be_bytes([s.data[18], s.data[19]]), 0x1234 + i as u16);
                    assert_eq!(csum_fold(csum_partial(&s.data[14..34], 0)), 0, "IPv4 header checksum");
                }
                let seq = u32::from_be_bytes(s.data[l4 + 4..l4 + 8].try_into().unwrap());
                assert_eq!(seq, 0xffff_fff0u32.wrapping_add(1448 * i as u32));
                let flags = s.data[l4 + 13];
                assert_eq!(flags & 0x80 != 0, i == 0, "CWR on the first segment only");
                assert_eq!(flags & 0x09 == 0x09, i == 2, "FIN and PSH on the last only");
                assert_eq!(flags & 0x10, 0x10, "ACK on all");
                // The kernel completes the checksum on the way out, as finalize_checksum does.
                assert!(finalize_checksum(s));
                assert!(tcp_checksum_ok(&s.data, l3), "segment {i} v6={v6}");
                payload.extend_from_slice(&s.data[l4 + 20..]);
            }
            assert_eq!(payload, original[ETH_HLEN + l3 + 20..]);
        }
    }

    #[test]
    fn flip_only_after_header() {
        let mut p = Packet::new(vec![0u8; 20]);
        for bit in 0..1000 {
            assert!(flip_payload_bit(&mut p, bit));
            assert!(p.data[..14].iter().all(|&b| b == 0));
            flip_payload_bit(&mut p, bit);
        }
        let mut p = Packet::new(vec![0u8; 14]);
        assert!(!flip_payload_bit(&mut p, 3));
    }
}
