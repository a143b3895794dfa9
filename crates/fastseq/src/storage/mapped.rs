//! The private files pipelines map (the data files of their sessions' private copies, which
//! `spill.rs`, above this file, points them at), registered with their address ranges while they are mapped:
//! bytes in one are not spilled again, and a writer copies them from the file in the kernel
//! instead of writing them from memory (which would fault every page of the mapping in).
use std::fs::File;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// (start, end, file) of every live mapping.
static MAPPED: Mutex<Vec<(usize, usize, Arc<File>)>> = Mutex::new(Vec::new());

/// A private file's mapping; it leaves the registry when the last slice of it is dropped.
pub struct Mapping(memmap2::Mmap);

impl Mapping {
    /// Maps `file`, which only this process can reach (its folder is private and removed
    /// once the session exists) and which nothing writes to any more.
    pub fn of(file: File) -> std::io::Result<Mapping> {
        // SAFETY: see above: the file cannot be truncated or changed under the mapping.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        let start = map.as_ptr() as usize;
        if let Ok(mut m) = MAPPED.lock() {
            m.push((start, start + map.len(), Arc::new(file)));
        }
        Ok(Mapping(map))
    }
}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let start = self.0.as_ptr() as usize;
        if let Ok(mut m) = MAPPED.lock() {
            m.retain(|&(s, ..)| s != start);
        }
    }
}

/// The mapped file `b` is a slice of, and where in it `b` starts.
pub fn file_of(b: &Bytes) -> Option<(Arc<File>, u64)> {
    let p = b.as_ptr() as usize;
    let m = MAPPED.lock().ok()?;
    let (s, _, f) = m.iter().find(|&&(s, e, _)| p >= s && p + b.len() <= e && !b.is_empty())?;
    Some((f.clone(), (p - s) as u64))
}

pub fn is_mapped(b: &Bytes) -> bool {
    file_of(b).is_some()
}
