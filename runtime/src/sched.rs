//! A short scheduler time slice for the receivers' writer threads.
//!
//! Since Linux 6.12 the fair scheduler (EEVDF) lets a thread ask for a
//! shorter time slice than its default (0.7-3 ms, by the number of
//! processors): it gets the same share of the processor in shorter turns,
//! and when it wakes it may preempt a thread with a longer slice instead of
//! waiting for that thread's turn to end. The receivers' writer threads
//! ask for the shortest slice the kernel allows: woken by the request that
//! carries a delivery, a writer then runs at once instead of after the
//! waking worker's turn. The dispatcher's threads keep the default: there
//! the gain in latency cost throughput of one message per request. Both
//! are measured in BENCHMARKS.md ("Commit -> effect, fifth pass").
//!
//! Best effort: older kernels ignore the request, and a refusal (a seccomp
//! profile, another scheduling policy) leaves the thread as it was.

/// The kernel's minimum custom slice.
#[cfg(target_os = "linux")]
const SLICE_NS: u64 = 100_000;

/// Asks the scheduler for a short time slice for the calling thread (a
/// receiver's writer).
pub(crate) fn request_short_slice() {
    #[cfg(target_os = "linux")]
    if let Err(error) = linux::set_slice(SLICE_NS) {
        tracing::debug!(%error, "cannot shorten this thread's time slice");
    }
}

#[cfg(target_os = "linux")]
mod linux {
    /// The calling thread's scheduling attributes.
    fn attributes() -> std::io::Result<libc::sched_attr> {
        let size = std::mem::size_of::<libc::sched_attr>() as u32;
        // SAFETY: `sched_attr` is plain data, all zeros is a valid value.
        let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; `attr` is `size` bytes.
        let read = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut attr as *mut libc::sched_attr,
                size,
                0,
            )
        };
        if read != 0 {
            return Err(std::io::Error::last_os_error());
        }
        attr.size = size;
        Ok(attr)
    }

    /// Sets the calling thread's slice, keeping its policy and nice value;
    /// only a thread of the fair policy (`SCHED_OTHER`) is changed.
    pub(super) fn set_slice(slice_ns: u64) -> std::io::Result<()> {
        let mut attr = attributes()?;
        if attr.sched_policy != libc::SCHED_OTHER as u32 {
            return Ok(());
        }
        attr.sched_runtime = slice_ns;
        // SAFETY: pid 0 is the calling thread; the kernel reads
        // `attr.size` bytes.
        let written = unsafe {
            libc::syscall(
                libc::SYS_sched_setattr,
                0,
                &attr as *const libc::sched_attr,
                0,
            )
        };
        if written != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        /// The slice a thread asked for is the one the kernel reports back
        /// (on a kernel that has custom slices: 6.12 and later).
        #[test]
        fn a_thread_gets_the_slice_it_asks_for() {
            std::thread::spawn(|| {
                super::set_slice(super::super::SLICE_NS).expect("sched_setattr");
                let attr = super::attributes().expect("sched_getattr");
                assert_eq!(attr.sched_policy, libc::SCHED_OTHER as u32);
                let release =
                    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
                let mut parts = release
                    .trim()
                    .split(['.', '-'])
                    .map(|p| p.parse::<u32>().unwrap_or(0));
                let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
                if version >= (6, 12) {
                    assert_eq!(attr.sched_runtime, super::super::SLICE_NS);
                }
            })
            .join()
            .expect("thread");
        }
    }
}
