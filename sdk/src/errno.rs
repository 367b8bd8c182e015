//! POSIX error numbers as they travel through the graph and over the wire.
//!
//! An [`Errno`] is the Linux numeric value; the named constants cover what
//! translators return. Numbers that are not named still round-trip unchanged.

use std::fmt;

/// A POSIX errno value (Linux numbering), the error half of every fop.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Errno(pub i32);

macro_rules! errnos {
    ($($name:ident = $val:expr, $desc:expr;)*) => {
        impl Errno {
            $(#[doc = $desc] pub const $name: Errno = Errno($val);)*

            /// The symbolic name (`"ENOENT"`), if this value is one we name.
            pub fn name(self) -> Option<&'static str> {
                match self.0 { $($val => Some(stringify!($name)),)* _ => None }
            }

            /// A short human description.
            pub fn description(self) -> &'static str {
                match self.0 { $($val => $desc,)* _ => "unknown error" }
            }

            /// Looks a value up by its symbolic name.
            pub fn from_name(name: &str) -> Option<Errno> {
                match name { $(stringify!($name) => Some(Errno($val)),)* _ => None }
            }
        }
    };
}

errnos! {
    EPERM = 1, "operation not permitted";
    ENOENT = 2, "no such file or directory";
    ESRCH = 3, "no such process";
    EINTR = 4, "interrupted";
    EIO = 5, "input/output error";
    ENXIO = 6, "no such device or address";
    E2BIG = 7, "argument list too long";
    EBADF = 9, "bad file descriptor";
    EAGAIN = 11, "resource temporarily unavailable";
    ENOMEM = 12, "out of memory";
    EACCES = 13, "permission denied";
    EFAULT = 14, "bad address";
    EBUSY = 16, "device or resource busy";
    EEXIST = 17, "file exists";
    EXDEV = 18, "cross-device link";
    ENODEV = 19, "no such device";
    ENOTDIR = 20, "not a directory";
    EISDIR = 21, "is a directory";
    EINVAL = 22, "invalid argument";
    ENFILE = 23, "too many open files in system";
    EMFILE = 24, "too many open files";
    ETXTBSY = 26, "text file busy";
    EFBIG = 27, "file too large";
    ENOSPC = 28, "no space left on device";
    ESPIPE = 29, "illegal seek";
    EROFS = 30, "read-only file system";
    EMLINK = 31, "too many links";
    ERANGE = 34, "result out of range";
    EDEADLK = 35, "deadlock avoided";
    ENAMETOOLONG = 36, "file name too long";
    ENOLCK = 37, "no locks available";
    ENOSYS = 38, "function not implemented";
    ENOTEMPTY = 39, "directory not empty";
    ELOOP = 40, "too many levels of symbolic links";
    ENODATA = 61, "no data available";
    ETIME = 62, "timer expired";
    EOVERFLOW = 75, "value too large for defined data type";
    EBADFD = 77, "file descriptor in bad state";
    EOPNOTSUPP = 95, "operation not supported";
    EADDRINUSE = 98, "address already in use";
    ENETDOWN = 100, "network is down";
    ECONNABORTED = 103, "connection aborted";
    ECONNRESET = 104, "connection reset by peer";
    ENOTCONN = 107, "transport endpoint is not connected";
    ETIMEDOUT = 110, "connection timed out";
    ECONNREFUSED = 111, "connection refused";
    ESTALE = 116, "stale file handle";
    EDQUOT = 122, "disk quota exceeded";
    ECANCELED = 125, "operation canceled";
}

impl Errno {
    /// ENODATA under its BSD name, as xattr code often spells it.
    pub const ENOATTR: Errno = Errno::ENODATA;
    /// EWOULDBLOCK is EAGAIN on Linux.
    pub const EWOULDBLOCK: Errno = Errno::EAGAIN;
    /// ENOTSUP is EOPNOTSUPP on Linux.
    pub const ENOTSUP: Errno = Errno::EOPNOTSUPP;

    /// The errno carried by an I/O error, EIO when it carries none.
    pub fn from_io(e: &std::io::Error) -> Errno {
        e.raw_os_error().map(Errno).unwrap_or(Errno::EIO)
    }

    /// The raw value, for FUSE replies and syscalls.
    pub fn raw(self) -> i32 {
        self.0
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Errno {
        Errno::from_io(&e)
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.description()),
            None => write!(f, "errno {}", self.0),
        }
    }
}

impl std::error::Error for Errno {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(Errno::from_name("ENOENT"), Some(Errno::ENOENT));
        assert_eq!(Errno::ENOTCONN.name(), Some("ENOTCONN"));
        assert_eq!(format!("{:?}", Errno(9999)), "Errno(9999)");
        assert_eq!(Errno::from_io(&std::io::Error::from_raw_os_error(2)), Errno::ENOENT);
    }
}
