//! Listening sockets (TCP via socket2 with SO_REUSEPORT when asked, Unix socket).
