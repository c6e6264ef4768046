//! A frame travelling through the emulator, and byte-level helpers.

/// Size of `struct virtio_net_hdr` (PACKET_VNET_HDR).
pub const VNET_HDR_LEN: usize = 10;
pub const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
pub const VIRTIO_NET_HDR_F_DATA_VALID: u8 = 2;
pub const ETH_HLEN: usize = 14;

#[derive(Debug)]
pub struct Packet {
    /// The Ethernet frame (header + payload, no FCS).
    pub data: Vec<u8>,
    /// virtio_net_hdr the kernel gave us (checksum-offload state).
    pub vnet: [u8; VNET_HDR_LEN],
    /// Arrival time (ns, CLOCK_MONOTONIC).
    pub arrival: u64,
    /// Skip delay and jitter (netem reorder).
    pub skip_delay: bool,
}

impl Packet {
    pub fn new(data: Vec<u8>) -> Self {
        Packet { data, vnet: [0; VNET_HDR_LEN], arrival: 0, skip_delay: false }
    }
    #[inline]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.data.len()
    }
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
