//! The agent's heap as the C allocator (glibc malloc) keeps it: a long-lived, mostly idle
//! process whose resident memory is budgeted (issue 28: ≤ 40 MiB with 8 targets).
//!
//! - [`limit_arenas`]: at most [`MAX_ARENAS`] malloc arenas. glibc makes up to 8 per core,
//!   one for each thread that allocates while another holds an arena (the runtime's worker,
//!   its blocking pool, the probes' drain thread), and each arena keeps its own freed pages.
//! - [`release_freed`]: hands freed pages back to the kernel (`malloc_trim(0)`), after the
//!   start's large transient allocations (the kernel's BTF, parsed to load the probes).
//!
//! Both are no-ops on other C libraries (musl keeps no per-thread arenas).

/// Arenas the agent's threads share (glibc `M_ARENA_MAX`).
pub const MAX_ARENAS: i32 = 2;

/// Caps the malloc arenas at [`MAX_ARENAS`]. Call before any thread starts. Returns whether
/// the allocator took the setting (always `false` off glibc).
pub fn limit_arenas() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets an allocator parameter; called before other threads run.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, MAX_ARENAS) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Returns the heap's freed pages to the kernel. Returns whether any memory was released
/// (always `false` off glibc).
pub fn release_freed() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks and trims the allocator's own free lists.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_pages_inside_the_heap_go_back_to_the_kernel() {
        // 48 MiB in 4 KiB blocks (below the mmap threshold: heap memory); two of every three
        // freed, so the holes (8 KiB, a whole page at least) sit between live blocks, where
        // free() never trims by itself.
        let mut blocks: Vec<Option<Vec<u8>>> =
            (0..12_288).map(|i| Some(vec![i as u8; 4096])).collect();
        for (i, b) in blocks.iter_mut().enumerate() {
            if i % 3 != 0 {
                *b = None;
            }
        }
        assert!(release_freed(), "malloc_trim released nothing");
        assert_eq!(blocks.iter().flatten().count(), 4096);
    }
}
