//! Copying byte ranges from one file into another in the kernel: `copy_file_range` within
//! one file system (a clone of the extents where the file system shares them, btrfs or XFS),
//! `sendfile` across file systems or where the first is refused. The bytes never pass through
//! this process's memory, and holes in the source stay holes in the copy (a sparse 2 GB
//! weight costs its data, not 2 GB of page cache and disk).
use std::fs::File;
use std::io;
#[cfg(target_os = "linux")]
use std::os::fd::AsRawFd;

/// What one copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Bytes the kernel copied (holes are not counted).
    pub bytes: u64,
    /// Bytes copied with `sendfile` (the fallback).
    pub by_sendfile: u64,
}

impl std::ops::AddAssign for Copied {
    fn add_assign(&mut self, o: Copied) {
        self.bytes += o.bytes;
        self.by_sendfile += o.by_sendfile;
    }
}

/// Copies between one pair of files, remembering when `copy_file_range` does not work
/// between them (another file system) so that it is tried once, not for every range.
pub struct Copier<'a> {
    src: &'a File,
    dst: &'a File,
    sendfile_only: bool,
}

/// `sendfile` copies at most this much per call (Linux caps it just below 2 GiB).
const SENDFILE_MAX: u64 = 0x7fff_f000;

impl<'a> Copier<'a> {
    pub fn new(src: &'a File, dst: &'a File) -> Copier<'a> {
        Copier { src, dst, sendfile_only: false }
    }

    /// Copies `len` bytes at `from` in the source to `to` in the destination, which must
    /// already be at least `to + len` long (see `File::set_len`): a hole of the source is
    /// skipped and reads as zeros there. A source that ends before `from + len` is an
    /// `UnexpectedEof` error (it got shorter while it was copied).
    pub fn copy(&mut self, from: u64, to: u64, len: u64) -> io::Result<Copied> {
        let end = from.checked_add(len).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut done = Copied::default();
        let mut at = from;
        while at < end {
            let Some((data, data_end)) = next_data(self.src, at, end)? else {
                // The rest is a hole, or the file ends before the range does.
                if self.src.metadata()?.len() < end {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the source ended before the range"));
                }
                break;
            };
            done += self.copy_data(data, to + (data - from), data_end - data)?;
            at = data_end;
        }
        Ok(done)
    }

    /// Copies `len` bytes of data (no hole) at `from` to `to`.
    fn copy_data(&mut self, mut from: u64, mut to: u64, mut len: u64) -> io::Result<Copied> {
        let mut done = Copied::default();
        while len > 0 {
            let n = if self.sendfile_only { 0 } else { self.copy_file_range(from, to, len)? };
            let n = if n > 0 {
                n
            } else {
                // Refused (another file system), or 0 bytes: some file systems report 0 for
                // a file they cannot copy this way. sendfile settles it; 0 from it is the end.
                let n = self.sendfile(from, to, len.min(SENDFILE_MAX))?;
                if n == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the source ended before the range"));
                }
                done.by_sendfile += n;
                n
            };
            done.bytes += n;
            (from, to, len) = (from + n, to + n, len - n);
        }
        Ok(done)
    }

    /// Bytes copied, or 0 when the kernel will not copy between these files this way (and
    /// from then on is not asked).
    #[cfg(target_os = "linux")]
    fn copy_file_range(&mut self, from: u64, to: u64, len: u64) -> io::Result<u64> {
        let (mut off_in, mut off_out) = (from as libc::loff_t, to as libc::loff_t);
        loop {
            // SAFETY: two descriptors this struct borrows, offsets it owns; the kernel
            // copies between the files and writes nothing into this process's memory but
            // the offsets.
            let n = unsafe {
                libc::copy_file_range(
                    self.src.as_raw_fd(),
                    &mut off_in,
                    self.dst.as_raw_fd(),
                    &mut off_out,
                    len as usize,
                    0,
                )
            };
            if n >= 0 {
                return Ok(n as u64);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EPERM | libc::EBADF) => {
                    self.sendfile_only = true;
                    return Ok(0);
                }
                _ => return Err(e),
            }
        }
    }

    /// Elsewhere than on Linux there is no kernel copy between two files: read and written.
    #[cfg(not(target_os = "linux"))]
    fn copy_file_range(&mut self, _: u64, _: u64, _: u64) -> io::Result<u64> {
        Ok(0)
    }

    #[cfg(not(target_os = "linux"))]
    fn sendfile(&mut self, from: u64, to: u64, len: u64) -> io::Result<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; len.min(1 << 20) as usize];
        let n = self.src.read_at(&mut buf, from)?;
        self.dst.write_all_at(&buf[..n], to)?;
        Ok(n as u64)
    }

    /// Bytes copied by `sendfile`, which writes at the destination's file position.
    #[cfg(target_os = "linux")]
    fn sendfile(&mut self, from: u64, to: u64, len: u64) -> io::Result<u64> {
        use std::io::Seek;
        (&mut &*self.dst).seek(io::SeekFrom::Start(to))?;
        let mut off_in = from as libc::off_t;
        loop {
            // SAFETY: as above; the kernel reads the source at `off_in` and writes at the
            // destination's position.
            let n = unsafe { libc::sendfile(self.dst.as_raw_fd(), self.src.as_raw_fd(), &mut off_in, len as usize) };
            if n >= 0 {
                return Ok(n as u64);
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

/// The first stretch of data in `[at, end)` of `file`: (start, end), or None when the rest
/// is a hole. File systems that do not report holes report all data.
#[cfg(not(target_os = "linux"))]
pub(crate) fn next_data(_: &File, at: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
    Ok((at < end).then_some((at, end)))
}

/// The first stretch of data in `[at, end)` of `file`: (start, end), or None when the rest
/// is a hole. File systems that do not report holes report all data.
#[cfg(target_os = "linux")]
pub(crate) fn next_data(file: &File, at: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
    let seek = |offset: u64, whence: libc::c_int| -> io::Result<Option<u64>> {
        // SAFETY: lseek on a descriptor the caller borrows; it moves only that descriptor's
        // position, which no copy here relies on (both calls take explicit offsets).
        let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None), // no data at or after `offset`
            Some(libc::EINVAL) => Ok(Some(offset)),
            _ => Err(e),
        }
    };
    let Some(data) = seek(at, libc::SEEK_DATA)? else { return Ok(None) };
    if data >= end {
        return Ok(None);
    }
    let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(end);
    Ok(Some((data, hole.clamp(data + 1, end))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    fn sparse_source(dir: &std::path::Path) -> (File, Vec<u8>) {
        // 0..1 MiB data, 1..9 MiB hole, 9..10 MiB data: what a reader sees.
        let path = dir.join("src.bin");
        let mut f = File::options().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        let head: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        f.write_all(&head).unwrap();
        f.seek(SeekFrom::Start(9 << 20)).unwrap();
        f.write_all(&head).unwrap();
        let mut expected = head.clone();
        expected.resize(9 << 20, 0);
        expected.extend_from_slice(&head);
        (f, expected)
    }

    fn copy_into(src: &File, dir: &std::path::Path, from: u64, len: u64) -> (Vec<u8>, Copied, u64) {
        let path = dir.join("dst.bin");
        let dst = File::options().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        dst.set_len(4096 + len).unwrap();
        let copied = Copier::new(src, &dst).copy(from, 4096, len).unwrap();
        let mut out = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut out).unwrap();
        use std::os::unix::fs::MetadataExt;
        let blocks = dst.metadata().unwrap().blocks() * 512;
        (out, copied, blocks)
    }

    #[test]
    fn ranges_are_copied_exactly_and_holes_stay_holes() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (src, expected) = sparse_source(dir.path());
        let (out, copied, blocks) = copy_into(&src, dir.path(), 0, expected.len() as u64);
        assert_eq!(&out[4096..], &expected[..]);
        assert!(out[..4096].iter().all(|&b| b == 0));
        assert_eq!(copied.bytes, 2 << 20, "the hole is not copied");
        assert!(blocks < 4 << 20, "the copy is sparse: {blocks} bytes on disk");
        // A range starting and ending inside data and holes.
        let (from, len) = ((1 << 20) - 100, (8 << 20) + 300);
        let (out, _, _) = copy_into(&src, dir.path(), from, len);
        assert_eq!(&out[4096..], &expected[from as usize..(from + len) as usize]);
    }

    #[test]
    fn a_source_shorter_than_the_range_is_an_error() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("short.bin");
        std::fs::write(&path, vec![1u8; 10_000]).unwrap();
        let src = File::open(&path).unwrap();
        let dst = tempfile::tempfile_in(dir.path()).unwrap();
        dst.set_len(20_000).unwrap();
        let err = Copier::new(&src, &dst).copy(5_000, 0, 10_000).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        let err = Copier::new(&src, &dst).copy(20_000, 0, 100).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "a range wholly past the end");
    }

    #[test]
    fn across_file_systems_sendfile_takes_over() {
        // /dev/shm is a tmpfs on Linux: another file system than the crate's folder.
        let Ok(shm) = tempfile::tempdir_in("/dev/shm") else { return };
        let path = shm.path().join("src.bin");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let src = File::open(&path).unwrap();
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (out, copied, _) = copy_into(&src, dir.path(), 1000, 200_000);
        assert_eq!(&out[4096..], &data[1000..201_000]);
        assert_eq!(copied.bytes, 200_000);
        use std::os::unix::fs::MetadataExt;
        if src.metadata().unwrap().dev() != File::open(dir.path()).unwrap().metadata().unwrap().dev() {
            assert_eq!(copied.by_sendfile, 200_000, "copy_file_range across file systems is refused");
        }
    }
}
