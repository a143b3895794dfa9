//! The process's allocator (mimalloc) and its tuning. At the bottom of the layers.

// Rayon's threads allocate and free side by side; mimalloc made a node-heavy merge about
// 10% faster than glibc's allocator (and 2x before nodes were kept as bytes).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc (v3, see its mimalloc.h) asks for transparent huge pages for its memory. Each
/// first touch of a 2 MB page then zeroes all of it, and on a busy machine the kernel may
/// compact memory to find one: a node-heavy merge (about 10 MB of tables) went from a
/// median of 15 ms to 23 ms, with outliers at 60. This turns that off for mimalloc's own
/// memory only; `MIMALLOC_ALLOW_THP=0` would disable huge pages for the whole process.
pub fn tune_allocator() {
    const MI_OPTION_ALLOW_THP: std::ffi::c_int = 43;
    unsafe extern "C" {
        fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    }
    // SAFETY: sets one integer option; mimalloc reads it on each request for OS memory.
    unsafe { mi_option_set(MI_OPTION_ALLOW_THP, 0) }
}
