//! AF_PACKET sockets bound to one existing interface, with recvmmsg/sendmmsg
//! batching and PACKET_VNET_HDR (so checksum-offload state survives the trip
//! through userspace).

use std::ffi::CString;
use std::io;
use std::mem;

use crate::packet::{Packet, VIRTIO_NET_HDR_F_DATA_VALID, VNET_HDR_LEN};

pub const BATCH: usize = 64;

const SOL_PACKET: i32 = 263;
const PACKET_ADD_MEMBERSHIP: i32 = 1;
const PACKET_MR_PROMISC: u16 = 1;
const PACKET_VNET_HDR: i32 = 15;
const PACKET_QDISC_BYPASS: i32 = 20;
const PACKET_IGNORE_OUTGOING: i32 = 23;
const PACKET_OUTGOING: u8 = 4;

fn last_err(what: &str, ifname: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what} on {ifname}: {e}"))
}

fn setsockopt_int(fd: i32, level: i32, opt: i32, val: i32) -> io::Result<()> {
    let r = unsafe {
        libc::setsockopt(fd, level, opt, &val as *const i32 as *const libc::c_void, mem::size_of::<i32>() as u32)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn ifindex(name: &str) -> io::Result<i32> {
    let c = CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad interface name"))?;
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface named '{name}' in this network namespace")))
    } else {
        Ok(idx as i32)
    }
}

pub fn mtu(name: &str) -> io::Result<usize> {
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    for (i, b) in name.bytes().take(libc::IFNAMSIZ - 1).enumerate() {
        req.ifr_name[i] = b as libc::c_char;
    }
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) };
    let e = io::Error::last_os_error();
    unsafe { libc::close(fd) };
    if r < 0 {
        return Err(e);
    }
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as usize)
}

pub struct PacketSocket {
    pub fd: i32,
    pub name: String,
    #[allow(dead_code)]
    pub ifindex: i32,
    pub mtu: usize,
}

impl PacketSocket {
    pub fn open(name: &str) -> io::Result<PacketSocket> {
        let ifindex = ifindex(name)?;
        let mtu = mtu(name).map_err(|e| io::Error::new(e.kind(), format!("SIOCGIFMTU on {name}: {e}")))?;
        // Protocol 0: receive nothing until bound to the one interface.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(last_err("socket(AF_PACKET) (needs CAP_NET_RAW)", name));
        }
        let s = PacketSocket { fd, name: name.to_string(), ifindex, mtu };
        // Never see our own transmissions (kernel >= 4.20); sll_pkttype is checked as well.
        setsockopt_int(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            .map_err(|e| io::Error::new(e.kind(), format!("PACKET_IGNORE_OUTGOING on {name}: {e}")))?;
        setsockopt_int(fd, SOL_PACKET, PACKET_VNET_HDR, 1)
            .map_err(|e| io::Error::new(e.kind(), format!("PACKET_VNET_HDR on {name}: {e}")))?;
        // Kernel receive timestamps: arrival times unaffected by when we get to run.
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
        // We are the qdisc: hand frames straight to the driver.
        let _ = setsockopt_int(fd, SOL_PACKET, PACKET_QDISC_BYPASS, 1);
        for (force, plain) in [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)] {
            if setsockopt_int(fd, libc::SOL_SOCKET, force, 32 << 20).is_err() {
                let _ = setsockopt_int(fd, libc::SOL_SOCKET, plain, 32 << 20);
            }
        }
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex;
        let r = unsafe {
            libc::bind(
                fd,
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            return Err(last_err("bind(AF_PACKET)", name));
        }
        // Promiscuous while the socket lives (veth passes everything anyway;
        // other device types need it to see frames for the far host's MAC).
        let mut mr: libc::packet_mreq = unsafe { mem::zeroed() };
        mr.mr_ifindex = ifindex;
        mr.mr_type = PACKET_MR_PROMISC;
        unsafe {
            libc::setsockopt(
                fd,
                SOL_PACKET,
                PACKET_ADD_MEMBERSHIP,
                &mr as *const libc::packet_mreq as *const libc::c_void,
                mem::size_of::<libc::packet_mreq>() as u32,
            );
        }
        Ok(s)
    }

    /// Discard whatever was queued on the socket before we were ready.
    pub fn flush(&self) {
        let mut buf = [0u8; 256];
        loop {
            let r =
                unsafe { libc::recv(self.fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
            if r < 0 {
                break;
            }
        }
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

/// Largest frame received: an offloaded (GSO) frame of up to 64 KB of IP
/// packet (the kernel's gso_max_size default) plus its Ethernet header.
pub const MAX_OFFLOADED_FRAME: usize = 65536 + 64;

/// Recycled frame buffers of two sizes: MTU-sized ones that the queue and
/// the delay line hold, and a few of the largest size that receiving needs
/// (a frame that turns out small is copied out of it, so a queue of small
/// frames never pins 64 KB each).
pub struct Pool {
    free: Vec<Vec<u8>>,
    free_large: Vec<Vec<u8>>,
    pub slot: usize,
    pub large_slot: usize,
}

impl Pool {
    pub fn new(slot: usize, prealloc: usize) -> Pool {
        let large_slot = MAX_OFFLOADED_FRAME.max(slot).next_multiple_of(64);
        Pool { free: (0..prealloc).map(|_| vec![0u8; slot]).collect(), free_large: Vec::new(), slot, large_slot }
    }
    /// A buffer of `slot` bytes, zero-filled or recycled.
    #[inline]
    pub fn get(&mut self) -> Vec<u8> {
        match self.free.pop() {
            Some(v) => v,
            None => vec![0u8; self.slot],
        }
    }
    /// A buffer of `large_slot` bytes.
    #[inline]
    pub fn get_large(&mut self) -> Vec<u8> {
        match self.free_large.pop() {
            Some(v) => v,
            None => vec![0u8; self.large_slot],
        }
    }
    #[inline]
    pub fn put(&mut self, mut v: Vec<u8>) {
        // Every buffer was created zero-filled with its slot's size and only ever
        // truncated, so its first `slot` bytes are initialised. A buffer made
        // elsewhere (a segment's, a duplicate's) is let go.
        if v.capacity() >= self.large_slot && self.free_large.len() < 1024 {
            unsafe { v.set_len(self.large_slot) };
            self.free_large.push(v);
        } else if v.capacity() >= self.slot && v.capacity() < self.large_slot && self.free.len() < 65536 {
            unsafe { v.set_len(self.slot) };
            self.free.push(v);
        }
    }
}

/// Outcome of one receive call.
#[derive(Default, Debug)]
pub struct RxResult {
    /// Messages the syscall returned (BATCH = more may be waiting).
    pub raw: usize,
    pub frames: usize,
    /// Frames dropped as unforwardable: larger than MTU+14 without segmentation
    /// offload, larger than MAX_OFFLOADED_FRAME, or offloaded in a way that
    /// cannot be segmented here (their sizes; the first one's).
    pub oversize: usize,
    pub oversize_len: usize,
    pub oversize_bytes: u64,
    pub error: Option<i32>,
}

const CMSG_BUF: usize = 64;

fn clock(id: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC, now.
pub fn realtime_offset() -> i128 {
    let m1 = clock(libc::CLOCK_MONOTONIC);
    let r = clock(libc::CLOCK_REALTIME);
    let m2 = clock(libc::CLOCK_MONOTONIC);
    r - (m1 + m2) / 2
}

/// Receive buffers of a batch. Each message is scattered over an MTU-sized buffer and, for the rest of an
/// offloaded frame, a large one whose first `slot` bytes are left free: a small frame is taken as it is (no
/// copy), a large one gets its first `slot` bytes copied into that gap.
pub struct Batch {
    ctrl: Vec<[u64; CMSG_BUF / 8]>,
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<[libc::iovec; 3]>,
    addrs: Vec<libc::sockaddr_ll>,
    vnets: Vec<[u8; VNET_HDR_LEN]>,
    bufs: Vec<Vec<u8>>,
    large: Vec<Vec<u8>>,
}

impl Batch {
    pub fn new(pool: &mut Pool) -> Batch {
        Batch {
            ctrl: vec![[0u64; CMSG_BUF / 8]; BATCH],
            hdrs: vec![unsafe { mem::zeroed() }; BATCH],
            iovs: vec![[libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 3]; BATCH],
            addrs: vec![unsafe { mem::zeroed() }; BATCH],
            vnets: vec![[0u8; VNET_HDR_LEN]; BATCH],
            bufs: (0..BATCH).map(|_| pool.get()).collect(),
            large: (0..BATCH).map(|_| pool.get_large()).collect(),
        }
    }

    /// Receive up to BATCH frames (non-blocking) into `out`. Each packet's
    /// `arrival` is the kernel's receive timestamp on CLOCK_MONOTONIC, or 0
    /// when the kernel gave none.
    pub fn recv(&mut self, sock: &PacketSocket, pool: &mut Pool, out: &mut Vec<Packet>) -> RxResult {
        let mut res = RxResult::default();
        for i in 0..BATCH {
            self.iovs[i][0] =
                libc::iovec { iov_base: self.vnets[i].as_mut_ptr() as *mut libc::c_void, iov_len: VNET_HDR_LEN };
            self.iovs[i][1] =
                libc::iovec { iov_base: self.bufs[i].as_mut_ptr() as *mut libc::c_void, iov_len: pool.slot };
            let rest = &mut self.large[i][pool.slot..];
            self.iovs[i][2] = libc::iovec { iov_base: rest.as_mut_ptr() as *mut libc::c_void, iov_len: rest.len() };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = &mut self.addrs[i] as *mut libc::sockaddr_ll as *mut libc::c_void;
            h.msg_namelen = mem::size_of::<libc::sockaddr_ll>() as u32;
            h.msg_iov = self.iovs[i].as_mut_ptr();
            h.msg_iovlen = 3;
            h.msg_control = self.ctrl[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = CMSG_BUF as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        let n = unsafe {
            libc::recvmmsg(
                sock.fd,
                self.hdrs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if e != libc::EAGAIN && e != libc::EINTR {
                res.error = Some(e);
            }
            return res;
        }
        res.raw = n as usize;
        let max_frame = sock.mtu + crate::packet::ETH_HLEN;
        let offset = realtime_offset();
        for i in 0..n as usize {
            let total = self.hdrs[i].msg_len as usize;
            if self.addrs[i].sll_pkttype == PACKET_OUTGOING || total < VNET_HDR_LEN {
                continue;
            }
            let flen = total - VNET_HDR_LEN;
            let vnet = self.vnets[i];
            let offloaded = vnet[1] != 0;
            let unforwardable = flen > pool.large_slot || (!offloaded && flen > max_frame);
            let data = if unforwardable {
                Vec::new()
            } else if flen <= pool.slot {
                let mut small = mem::replace(&mut self.bufs[i], pool.get());
                small.truncate(flen);
                small
            } else {
                let mut large = mem::replace(&mut self.large[i], pool.get_large());
                large[..pool.slot].copy_from_slice(&self.bufs[i][..pool.slot]);
                large.truncate(flen);
                large
            };
            let mut p = Packet::new(data);
            p.vnet = vnet;
            if unforwardable || !p.parse_gso() {
                res.oversize += 1;
                res.oversize_bytes += flen as u64;
                if res.oversize_len == 0 {
                    res.oversize_len = flen;
                }
                pool.put(p.data);
                continue;
            }
            p.arrival = self.timestamp(i, offset);
            out.push(p);
            res.frames += 1;
        }
        res
    }
}

impl Batch {
    fn timestamp(&self, i: usize, offset: i128) -> u64 {
        let h = &self.hdrs[i].msg_hdr;
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                    let rt = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128;
                    let mono = rt - offset;
                    return if mono > 0 { mono as u64 } else { 0 };
                }
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
        0
    }
}

/// Outcome of one send call.
#[derive(Default, Debug)]
pub struct TxResult {
    /// Packets on the wire (an offloaded frame counts as its segments), and their bytes.
    pub sent: usize,
    pub sent_bytes: u64,
    pub errors: usize,
    pub last_error: Option<i32>,
}

pub struct TxBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<[libc::iovec; 2]>,
}

impl Default for TxBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl TxBatch {
    pub fn new() -> TxBatch {
        TxBatch {
            hdrs: vec![unsafe { mem::zeroed() }; BATCH],
            iovs: vec![[libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2]; BATCH],
        }
    }

    /// Send all of `pkts` (in order) and give their buffers back to `pool`.
    pub fn send(&mut self, sock: &PacketSocket, pkts: &mut Vec<Packet>, pool: &mut Pool) -> TxResult {
        let mut res = TxResult::default();
        let mut start = 0;
        let mut retries = 0;
        for p in pkts.iter_mut() {
            // NEEDS_CSUM and, for a frame still whole, its segmentation are meaningful on transmit.
            p.vnet[0] &= !VIRTIO_NET_HDR_F_DATA_VALID;
            if p.segs <= 1 {
                p.vnet[1] = 0;
                p.vnet[2..6].fill(0);
            }
        }
        while start < pkts.len() {
            let n = (pkts.len() - start).min(BATCH);
            for i in 0..n {
                let p = &mut pkts[start + i];
                self.iovs[i][0] =
                    libc::iovec { iov_base: p.vnet.as_mut_ptr() as *mut libc::c_void, iov_len: VNET_HDR_LEN };
                self.iovs[i][1] =
                    libc::iovec { iov_base: p.data.as_mut_ptr() as *mut libc::c_void, iov_len: p.data.len() };
                let h = &mut self.hdrs[i].msg_hdr;
                h.msg_name = std::ptr::null_mut();
                h.msg_namelen = 0;
                h.msg_iov = self.iovs[i].as_mut_ptr();
                h.msg_iovlen = 2;
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
                h.msg_flags = 0;
            }
            let r = unsafe { libc::sendmmsg(sock.fd, self.hdrs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT) };
            if r > 0 {
                for p in &pkts[start..start + r as usize] {
                    res.sent_bytes += p.wire_len();
                    res.sent += p.segs as usize;
                }
                start += r as usize;
                retries = 0;
                continue;
            }
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            retries += 1;
            if (e == libc::EAGAIN || e == libc::EINTR || e == libc::ENOBUFS) && retries < 64 {
                continue;
            }
            // Give up on the first frame of the batch.
            res.errors += 1;
            res.last_error = Some(e);
            start += 1;
            retries = 0;
        }
        for p in pkts.drain(..) {
            pool.put(p.data);
        }
        res
    }
}
