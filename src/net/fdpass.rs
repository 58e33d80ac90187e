//! Descriptors passed over a Unix socket (SCM_RIGHTS): how an online restart moves the
//! listening sockets and client sockets to the new process. Sent with nix; received on libc,
//! so that descriptors that came with a truncated message are still closed (nix's reader
//! gives none back then).
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most descriptors one message carries (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 64;

/// Room for the control message of `n` descriptors.
fn cmsg_space(n: usize) -> usize {
    let bytes = u32::try_from(n * std::mem::size_of::<RawFd>()).unwrap_or(u32::MAX);
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(bytes) as usize }
}

/// One sendmsg(2) of `data` (part of it may be sent: the count is returned) with `fds`
/// attached to its first byte. Non-blocking sockets give WouldBlock as usual.
pub fn send_with_fds(sock: &impl AsRawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    if fds.len() > MAX_FDS {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    let iov = [io::IoSlice::new(data)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(io::Error::from)
}

/// One recvmsg(2) into `buf`: the bytes read (0: the peer closed) and the descriptors that
/// came with them (owned from now on; close-on-exec). Truncated control data is an error
/// (descriptors would have been lost).
pub fn recv_with_fds(sock: &impl AsRawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = vec![0u64; cmsg_space(MAX_FDS).div_ceil(8)];
    // SAFETY: msghdr is plain data; all-zero is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = cmsg_space(MAX_FDS) as _;
    // SAFETY: a valid socket and a msghdr pointing at live buffers of the sizes given.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control with msg_controllen bytes of cmsghdrs; each
    // SCM_RIGHTS header's data holds (cmsg_len - CMSG_LEN(0)) / 4 descriptors, now ours.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(
                        data.add(i * std::mem::size_of::<RawFd>()).cast::<RawFd>(),
                    );
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "descriptors were truncated (more than one message can carry)",
        ));
    }
    Ok((n as usize, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn descriptors_arrive_with_their_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, mut y) = UnixStream::pair().unwrap();
        let sent = send_with_fds(&a, b"hello", &[x.as_raw_fd()]).unwrap();
        assert_eq!(sent, 5);
        drop(x);
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        // The received descriptor is the same socket: what y writes, it reads.
        let got = UnixStream::from(fds.into_iter().next().unwrap());
        y.write_all(b"ping").unwrap();
        let mut r = [0u8; 4];
        std::io::Read::read_exact(&mut &got, &mut r).unwrap();
        assert_eq!(&r, b"ping");
    }

    #[test]
    fn plain_bytes_carry_no_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fds(&a, b"x", &[]).unwrap();
        let mut buf = [0u8; 4];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((n, fds.len()), (1, 0));
        drop(a);
        assert_eq!(recv_with_fds(&b, &mut buf).unwrap().0, 0);
    }
}
