//! A fault-injecting SQLite VFS for tests: simulated power cuts and full disks
//! under a real SQLite, on real files.
//!
//! The shim is registered once, under the name [`VFS_NAME`], and never as the
//! default VFS: a connection uses it only when opened with a URI filename
//! such as `file:/tmp/x/receiver.db?vfs=rfidl-faultfs` (see
//! [`FaultDir::db_uri`]; `rfidl_runtime::store::sqlite::open`, the receiver and the
//! dispatcher all open URI filenames). It wraps the platform's default VFS
//! (`sqlite3_vfs_find(NULL)`, the unix VFS): every file it opens embeds the
//! real VFS's file after a small header, and every I/O method forwards to the
//! real one, so locking, WAL and the shared-memory index work as usual.
//! Files outside a registered [`FaultDir`] pass through untouched, so tests
//! running in parallel threads do not see each other's faults.
//!
//! # The power-cut model
//!
//! * **What is durable** is what was synced. After each successful `xSync`
//!   of a file (the real `fsync` ran first), the shim copies the file's whole
//!   current content as its *durable image*. A write that no sync followed
//!   is not durable, however long ago it happened.
//! * **Directory entries** are durable only after a directory sync, and a
//!   directory sync makes the directory's current state durable: every file
//!   that exists then keeps its entry (with its last synced content, empty
//!   if it never had one), every file deleted by then is gone for good. A
//!   directory sync happens on the first sync of a file the shim created
//!   (SQLite's unix VFS fsyncs the directory there for a new WAL or
//!   journal; for a new main database file this is slightly optimistic) and
//!   on a delete with `syncDir` set. A file created and never synced does
//!   not exist after a cut; a file deleted without `syncDir` (a rollback
//!   journal after its commit, the WAL at the last connection's close)
//!   comes back with its last synced content until the next directory sync,
//!   as on a POSIX file system.
//! * **The `-shm` wal-index** is memory, never durable: it never has an image.
//! * **Write-back.** [`FaultDir::cut_power`] assumes the kernel wrote back
//!   nothing unsynced (the pessimistic case);
//!   [`FaultDir::cut_power_with_writeback`] lets a chosen subset of the
//!   writes and truncations since each file's last sync reach the disk,
//!   each whole or not at all, as a kernel flushing dirty pages on its own
//!   would (a WAL frame's header may arrive without its page: torn frames).
//! * **The cut** ([`FaultDir::cut_power`], or [`FaultDir::cut_at_sync`]
//!   inside the n-th sync from now) happens at one instant, under the
//!   directory's lock: a sync that finished before it is recorded, one after
//!   it is not, and reports failure (an `fsync` cannot return success on a
//!   machine without power). From then on, every read, write, truncate,
//!   sync, delete and open of the directory's files fails with an I/O
//!   error, so the still running (now "dead") process can neither
//!   acknowledge anything more nor touch the disk. [`PowerCut::restore_into`] then writes the durable images
//!   into a fresh directory, under the same file names: the disk as a reboot
//!   finds it. (That is the same as replacing each file in place, without
//!   pulling files from under the dead process's open descriptors.)
//!
//! # The full-disk model
//!
//! [`FaultDir::set_quota`] limits the total size of the directory's database
//! files (main database, WAL, journals; not the `-shm` index). A write or a
//! truncate that would grow a file past the quota fails with `SQLITE_FULL`,
//! as the unix VFS answers `ENOSPC`; so does a `SQLITE_FCNTL_SIZE_HINT`
//! asking for room past it. Writes within the existing size (overwrites, a
//! WAL reused after a checkpoint) still succeed, as on a real full disk.
//! Raising or clearing the quota lets growth succeed again.
//! [`FaultDir::full_refusals`] counts the `SQLITE_FULL` answers, so a test
//! can wait for the write it wants refused instead of sleeping.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rusqlite::ffi;

/// The name under which the shim is registered.
pub const VFS_NAME: &str = "rfidl-faultfs";

/// A temp directory whose SQLite files, opened through the shim, can lose
/// power or run out of space. Unregistered (faults stop applying) when
/// dropped.
pub struct FaultDir {
    /// Deleted with the `FaultDir`.
    _dir: tempfile::TempDir,
    target: Arc<Target>,
}

/// What a power cut left on disk: the durable image of each file, by name.
#[derive(Debug, Clone)]
pub struct PowerCut {
    pub images: BTreeMap<String, Vec<u8>>,
}

struct Target {
    /// Canonical path, as SQLite's `xFullPathname` gives it.
    dir: PathBuf,
    state: Mutex<TargetState>,
}

#[derive(Default)]
struct TargetState {
    powered_off: bool,
    quota: Option<u64>,
    /// What survives a cut, by path: files whose directory entry is durable.
    durable: BTreeMap<PathBuf, Durable>,
    /// Last synced content of files whose entry is not durable yet.
    pending: BTreeMap<PathBuf, Vec<u8>>,
    /// Writes and truncations since each file's last sync, in order (what
    /// the kernel may or may not have written back when the power goes).
    unsynced: BTreeMap<PathBuf, Vec<Unsynced>>,
    /// Every non-volatile file opened through the shim (for the quota).
    files: BTreeSet<PathBuf>,
    /// Successful syncs recorded (before the cut).
    syncs: u64,
    /// Syncs attempted while powered (for [`FaultDir::cut_at_sync`]).
    sync_calls: u64,
    /// `SQLITE_FULL` answers given so far.
    refusals: u64,
    armed: Option<ArmedCut>,
    tripped: Option<PowerCut>,
}

/// Decides, per unsynced change, whether the kernel wrote it back:
/// `(file name, index, count) -> bool`.
pub type WrittenBack = Box<dyn FnMut(&str, usize, usize) -> bool + Send>;

/// A cut waiting for its sync.
struct ArmedCut {
    at_call: u64,
    written_back: WrittenBack,
}

/// A change not yet synced.
enum Unsynced {
    Write { offset: usize, bytes: Vec<u8> },
    Truncate(usize),
}

impl Unsynced {
    fn apply(&self, content: &mut Vec<u8>) {
        match self {
            Unsynced::Write { offset, bytes } => {
                let end = offset + bytes.len();
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[*offset..end].copy_from_slice(bytes);
            }
            Unsynced::Truncate(size) => content.resize(*size, 0),
        }
    }
}

/// A file with a durable directory entry.
struct Durable {
    /// Its content as of its last sync (`None`: never synced: empty).
    content: Option<Vec<u8>>,
}

impl FaultDir {
    /// A fresh (empty) temp directory under the shim's control.
    pub fn new() -> Self {
        register();
        let dir = tempfile::tempdir().expect("tempdir");
        let canonical = dir.path().canonicalize().expect("canonical temp dir");
        let text = canonical.to_str().expect("UTF-8 temp dir");
        assert!(
            !text.contains(['?', '#', '%']),
            "temp dir {text} needs URI escaping"
        );
        let target = Arc::new(Target {
            dir: canonical,
            state: Mutex::new(TargetState::default()),
        });
        targets().push(Arc::clone(&target));
        Self { _dir: dir, target }
    }

    /// The directory (canonical).
    pub fn path(&self) -> &Path {
        &self.target.dir
    }

    /// A URI filename that opens `name` in this directory through the shim.
    pub fn db_uri(&self, name: &str) -> PathBuf {
        PathBuf::from(format!(
            "file:{}?vfs={VFS_NAME}",
            self.target.dir.join(name).display()
        ))
    }

    /// Limits the directory's database files to `bytes` in total (`None`: no limit).
    pub fn set_quota(&self, bytes: Option<u64>) {
        self.target.lock().quota = bytes;
    }

    /// Bytes the directory's database files take now (what the quota counts).
    pub fn usage(&self) -> u64 {
        self.target.lock().usage()
    }

    /// Writes refused with `SQLITE_FULL` so far.
    pub fn full_refusals(&self) -> u64 {
        self.target.lock().refusals
    }

    /// Syncs recorded so far.
    pub fn syncs(&self) -> u64 {
        self.target.lock().syncs
    }

    /// Cuts the power now: returns what is durable, and fails every later I/O
    /// on this directory's files. No unsynced write reached the disk.
    pub fn cut_power(&self) -> PowerCut {
        self.cut_power_with_writeback(|_, _, _| false)
    }

    /// Like [`cut_power`](Self::cut_power), but the kernel had written back
    /// some of the unsynced changes on its own: change `index` of the
    /// `count` writes and truncations made to file `name` since its last sync
    /// reached the disk if `written_back(name, index, count)` says so (asked
    /// once per change, in order; a write is kept or lost whole). Files whose
    /// directory entry is not durable are still lost.
    pub fn cut_power_with_writeback(
        &self,
        mut written_back: impl FnMut(&str, usize, usize) -> bool,
    ) -> PowerCut {
        self.target.lock().cut(&mut written_back)
    }

    /// Arms a cut inside the `n`-th sync from now (1: the next one): the
    /// power goes while that fsync runs, so it fails and records nothing,
    /// and write-back is decided by `written_back` as in
    /// [`cut_power_with_writeback`](Self::cut_power_with_writeback). Lets a
    /// test cut at every sync point of a workload: mid-commit, between a
    /// checkpoint's WAL sync and its database sync, and so on.
    pub fn cut_at_sync(
        &self,
        n: u64,
        written_back: impl FnMut(&str, usize, usize) -> bool + Send + 'static,
    ) {
        let mut state = self.target.lock();
        let at_call = state.sync_calls + n.max(1);
        state.armed = Some(ArmedCut {
            at_call,
            written_back: Box::new(written_back),
        });
    }

    /// The cut an armed trigger made, once it fired.
    pub fn tripped(&self) -> Option<PowerCut> {
        self.target.lock().tripped.clone()
    }
}

impl Drop for FaultDir {
    fn drop(&mut self) {
        targets().retain(|t| !Arc::ptr_eq(t, &self.target));
    }
}

impl PowerCut {
    /// Writes the durable images into `dir` (which should be empty): the disk
    /// after the reboot. Open it with the ordinary VFS.
    pub fn restore_into(&self, dir: &Path) {
        for (name, bytes) in &self.images {
            std::fs::write(dir.join(name), bytes).expect("restore a durable image");
        }
    }
}

impl Target {
    fn lock(&self) -> MutexGuard<'_, TargetState> {
        // A test that panicked while holding it must not hide other failures.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl TargetState {
    fn usage(&self) -> u64 {
        self.files
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }

    /// The power goes now: the disk as a reboot finds it.
    fn cut(&mut self, written_back: &mut dyn FnMut(&str, usize, usize) -> bool) -> PowerCut {
        self.powered_off = true;
        let mut images = BTreeMap::new();
        for (path, file) in &self.durable {
            let name = path
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            let mut content = file.content.clone().unwrap_or_default();
            let changes = self.unsynced.get(path).map_or(&[][..], Vec::as_slice);
            for (index, change) in changes.iter().enumerate() {
                if written_back(&name, index, changes.len()) {
                    change.apply(&mut content);
                }
            }
            images.insert(name, content);
        }
        PowerCut { images }
    }

    /// A directory fsync: the directory's current entries become durable.
    fn sync_directory(&mut self) {
        self.durable.retain(|path, _| path.exists());
        let existing: Vec<PathBuf> = self.files.iter().filter(|p| p.exists()).cloned().collect();
        for path in existing {
            let pending = self.pending.remove(&path);
            let file = self
                .durable
                .entry(path)
                .or_insert(Durable { content: None });
            if pending.is_some() {
                file.content = pending;
            }
        }
        self.pending.retain(|path, _| path.exists());
    }

    /// A file fsync: its content as of now becomes durable (its entry only
    /// if it already was).
    fn sync_file(&mut self, path: &Path, content: Vec<u8>) {
        self.unsynced.remove(path);
        match self.durable.get_mut(path) {
            Some(file) => file.content = Some(content),
            None => {
                self.pending.insert(path.to_path_buf(), content);
            }
        }
        self.syncs += 1;
    }

    /// Logs a change made while the power is on.
    fn log(&mut self, path: &Path, change: Unsynced) {
        if !self.powered_off {
            self.unsynced
                .entry(path.to_path_buf())
                .or_default()
                .push(change);
        }
    }

    /// Whether a file now `current` bytes long may become `wanted` bytes long.
    fn room_for(&self, current: u64, wanted: u64) -> bool {
        match self.quota {
            Some(quota) if wanted > current => self.usage() + (wanted - current) <= quota,
            _ => true,
        }
    }
}

fn targets() -> MutexGuard<'static, Vec<Arc<Target>>> {
    static TARGETS: Mutex<Vec<Arc<Target>>> = Mutex::new(Vec::new());
    TARGETS.lock().unwrap_or_else(|e| e.into_inner())
}

fn target_of(path: &Path) -> Option<Arc<Target>> {
    targets()
        .iter()
        .find(|t| path.parent() == Some(t.dir.as_path()))
        .cloned()
}

// ---------------------------------------------------------------------------
// The VFS.

/// The real (default) VFS, kept in `pAppData`.
fn real_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: our VFS struct is leaked and its pAppData is the real VFS.
    unsafe { (*vfs).pAppData.cast() }
}

/// Our file: SQLite allocates `szOsFile` bytes; the real VFS's file follows
/// this header at [`REAL_OFFSET`].
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    info: *mut FileInfo,
}

struct FileInfo {
    path: PathBuf,
    target: Option<Arc<Target>>,
    /// Created by this open and not synced yet: its first sync also syncs
    /// the directory.
    new_entry: AtomicBool,
}

const REAL_OFFSET: usize = std::mem::size_of::<ShimFile>().next_multiple_of(16);

fn real_file(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: szOsFile reserves REAL_OFFSET + the real file's size.
    unsafe { file.cast::<u8>().add(REAL_OFFSET).cast() }
}

fn info<'a>(file: *mut ffi::sqlite3_file) -> &'a FileInfo {
    // SAFETY: set by shim_open before pMethods, freed only by shim_close.
    unsafe { &*(*file.cast::<ShimFile>()).info }
}

fn real_methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: the real file was opened successfully, so pMethods is set.
    unsafe { &*(*real_file(file)).pMethods }
}

/// Registers the shim (once per process).
pub fn register() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        // SAFETY: plain FFI calls; the leaked structs live for the process.
        unsafe {
            let real = ffi::sqlite3_vfs_find(ptr::null());
            assert!(!real.is_null(), "no default SQLite VFS");
            let name = CString::new(VFS_NAME).expect("name");
            let vfs = Box::new(ffi::sqlite3_vfs {
                iVersion: 2,
                szOsFile: (REAL_OFFSET as c_int) + (*real).szOsFile,
                mxPathname: (*real).mxPathname,
                pNext: ptr::null_mut(),
                zName: name.into_raw(),
                pAppData: real.cast(),
                xOpen: Some(shim_open),
                xDelete: Some(shim_delete),
                xAccess: Some(shim_access),
                xFullPathname: Some(shim_full_pathname),
                xDlOpen: Some(shim_dl_open),
                xDlError: Some(shim_dl_error),
                xDlSym: Some(shim_dl_sym),
                xDlClose: Some(shim_dl_close),
                xRandomness: Some(shim_randomness),
                xSleep: Some(shim_sleep),
                xCurrentTime: Some(shim_current_time),
                xGetLastError: Some(shim_get_last_error),
                xCurrentTimeInt64: Some(shim_current_time_int64),
                xSetSystemCall: None,
                xGetSystemCall: None,
                xNextSystemCall: None,
            });
            let rc = ffi::sqlite3_vfs_register(Box::into_raw(vfs), 0);
            assert_eq!(rc, ffi::SQLITE_OK, "register the fault VFS");
        }
    });
}

/// Version 2: the shared-memory methods, no memory-mapped I/O (so every
/// read goes through xRead).
static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(io_close),
    xRead: Some(io_read),
    xWrite: Some(io_write),
    xTruncate: Some(io_truncate),
    xSync: Some(io_sync),
    xFileSize: Some(io_file_size),
    xLock: Some(io_lock),
    xUnlock: Some(io_unlock),
    xCheckReservedLock: Some(io_check_reserved_lock),
    xFileControl: Some(io_file_control),
    xSectorSize: Some(io_sector_size),
    xDeviceCharacteristics: Some(io_device_characteristics),
    xShmMap: Some(io_shm_map),
    xShmLock: Some(io_shm_lock),
    xShmBarrier: Some(io_shm_barrier),
    xShmUnmap: Some(io_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

fn path_of(name: *const c_char) -> Option<PathBuf> {
    if name.is_null() {
        return None;
    }
    // SAFETY: SQLite passes NUL-terminated names.
    let text = unsafe { CStr::from_ptr(name) };
    Some(PathBuf::from(text.to_str().ok()?))
}

fn powered_off(target: Option<&Arc<Target>>) -> bool {
    target.is_some_and(|t| t.lock().powered_off)
}

unsafe extern "C" fn shim_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real = real_vfs(vfs);
    // SAFETY: `file` points at szOsFile bytes owned by SQLite.
    unsafe {
        (*file).pMethods = ptr::null();
        (*file.cast::<ShimFile>()).info = ptr::null_mut();
    }
    let path = path_of(name);
    let target = path.as_deref().and_then(target_of);
    if powered_off(target.as_ref()) {
        return ffi::SQLITE_CANTOPEN;
    }
    let created = target.is_some() && path.as_deref().is_some_and(|p| !p.exists());
    // SAFETY: forwarding to the real VFS with its own file.
    let rc =
        unsafe { ((*real).xOpen.expect("xOpen"))(real, name, real_file(file), flags, out_flags) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    if let (Some(target), Some(path)) = (&target, &path) {
        let mut state = target.lock();
        state.files.insert(path.clone());
        if created {
            // A new file: changes logged for an older one of that name are moot.
            state.unsynced.remove(path);
        }
    }
    let info = Box::new(FileInfo {
        path: path.unwrap_or_default(),
        target,
        new_entry: AtomicBool::new(created),
    });
    // SAFETY: as above; pMethods last, so xClose sees a complete file.
    unsafe {
        (*file.cast::<ShimFile>()).info = Box::into_raw(info);
        (*file).pMethods = &IO_METHODS;
    }
    rc
}

unsafe extern "C" fn shim_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    let real = real_vfs(vfs);
    let target = path_of(name).and_then(|p| target_of(&p).map(|t| (p, t)));
    if let Some((_, target)) = &target
        && target.lock().powered_off
    {
        return ffi::SQLITE_IOERR_DELETE;
    }
    // SAFETY: forwarding.
    let rc = unsafe { ((*real).xDelete.expect("xDelete"))(real, name, sync_dir) };
    if rc == ffi::SQLITE_OK
        && sync_dir != 0
        && let Some((_, target)) = &target
    {
        let mut state = target.lock();
        if state.powered_off {
            return ffi::SQLITE_IOERR_DELETE;
        }
        state.sync_directory();
    }
    rc
}

unsafe extern "C" fn shim_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xAccess.expect("xAccess"))(real, name, flags, out) }
}

unsafe extern "C" fn shim_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xFullPathname.expect("xFullPathname"))(real, name, n, out) }
}

unsafe extern "C" fn shim_dl_open(vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> *mut c_void {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xDlOpen.expect("xDlOpen"))(real, name) }
}

unsafe extern "C" fn shim_dl_error(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xDlError.expect("xDlError"))(real, n, out) }
}

type DlSymbol = Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>;

unsafe extern "C" fn shim_dl_sym(
    vfs: *mut ffi::sqlite3_vfs,
    handle: *mut c_void,
    symbol: *const c_char,
) -> DlSymbol {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xDlSym.expect("xDlSym"))(real, handle, symbol) }
}

unsafe extern "C" fn shim_dl_close(vfs: *mut ffi::sqlite3_vfs, handle: *mut c_void) {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xDlClose.expect("xDlClose"))(real, handle) }
}

unsafe extern "C" fn shim_randomness(
    vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xRandomness.expect("xRandomness"))(real, n, out) }
}

unsafe extern "C" fn shim_sleep(vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xSleep.expect("xSleep"))(real, micros) }
}

unsafe extern "C" fn shim_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xCurrentTime.expect("xCurrentTime"))(real, out) }
}

unsafe extern "C" fn shim_get_last_error(
    vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let real = real_vfs(vfs);
    // SAFETY: forwarding.
    unsafe { ((*real).xGetLastError.expect("xGetLastError"))(real, n, out) }
}

unsafe extern "C" fn shim_current_time_int64(
    vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    let real = real_vfs(vfs);
    // SAFETY: forwarding (the unix VFS is at least version 2).
    unsafe { ((*real).xCurrentTimeInt64.expect("xCurrentTimeInt64"))(real, out) }
}

// --- I/O methods -------------------------------------------------------------

/// The file's target when power is off (the I/O must fail).
fn dead(file: *mut ffi::sqlite3_file) -> bool {
    powered_off(info(file).target.as_ref())
}

fn real_size(file: *mut ffi::sqlite3_file) -> Result<u64, c_int> {
    let mut size: ffi::sqlite3_int64 = 0;
    let real = real_file(file);
    // SAFETY: forwarding.
    let rc = unsafe { (real_methods(file).xFileSize.expect("xFileSize"))(real, &mut size) };
    if rc == ffi::SQLITE_OK {
        Ok(size.max(0) as u64)
    } else {
        Err(rc)
    }
}

/// `SQLITE_OK` if the file may grow to `wanted` bytes under the quota.
fn check_room(file: *mut ffi::sqlite3_file, wanted: u64) -> c_int {
    let Some(target) = &info(file).target else {
        return ffi::SQLITE_OK;
    };
    if target.lock().quota.is_none() {
        return ffi::SQLITE_OK;
    }
    let current = match real_size(file) {
        Ok(size) => size,
        Err(rc) => return rc,
    };
    let mut state = target.lock();
    if state.room_for(current, wanted) {
        ffi::SQLITE_OK
    } else {
        state.refusals += 1;
        ffi::SQLITE_FULL
    }
}

unsafe extern "C" fn io_close(file: *mut ffi::sqlite3_file) -> c_int {
    let real = real_file(file);
    // SAFETY: forwarding; then the header's box is freed exactly once.
    unsafe {
        let rc = (real_methods(file).xClose.expect("xClose"))(real);
        let shim = file.cast::<ShimFile>();
        drop(Box::from_raw((*shim).info));
        (*shim).info = ptr::null_mut();
        rc
    }
}

unsafe extern "C" fn io_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    if dead(file) {
        return ffi::SQLITE_IOERR_READ;
    }
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xRead.expect("xRead"))(real_file(file), buf, amount, offset) }
}

unsafe extern "C" fn io_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    if dead(file) {
        return ffi::SQLITE_IOERR_WRITE;
    }
    let rc = check_room(file, offset.max(0) as u64 + amount.max(0) as u64);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // SAFETY: forwarding.
    let rc = unsafe {
        (real_methods(file).xWrite.expect("xWrite"))(real_file(file), buf, amount, offset)
    };
    let info = info(file);
    if rc == ffi::SQLITE_OK
        && let Some(target) = &info.target
    {
        // SAFETY: SQLite passes `amount` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), amount.max(0) as usize) };
        let change = Unsynced::Write {
            offset: offset.max(0) as usize,
            bytes: bytes.to_vec(),
        };
        target.lock().log(&info.path, change);
    }
    rc
}

unsafe extern "C" fn io_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    if dead(file) {
        return ffi::SQLITE_IOERR_TRUNCATE;
    }
    let rc = check_room(file, size.max(0) as u64);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // SAFETY: forwarding.
    let rc = unsafe { (real_methods(file).xTruncate.expect("xTruncate"))(real_file(file), size) };
    let info = info(file);
    if rc == ffi::SQLITE_OK
        && let Some(target) = &info.target
    {
        target
            .lock()
            .log(&info.path, Unsynced::Truncate(size.max(0) as usize));
    }
    rc
}

unsafe extern "C" fn io_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    if dead(file) {
        return ffi::SQLITE_IOERR_FSYNC;
    }
    if let Some(target) = &info(file).target {
        let mut state = target.lock();
        state.sync_calls += 1;
        let calls = state.sync_calls;
        if let Some(mut armed) = state.armed.take_if(|armed| armed.at_call == calls) {
            let cut = state.cut(&mut armed.written_back);
            state.tripped = Some(cut);
            return ffi::SQLITE_IOERR_FSYNC;
        }
    }
    // SAFETY: forwarding.
    let rc = unsafe { (real_methods(file).xSync.expect("xSync"))(real_file(file), flags) };
    let info = info(file);
    if rc == ffi::SQLITE_OK
        && let Some(target) = &info.target
    {
        // Read under the lock, so a cut is either wholly before or after this sync.
        let mut state = target.lock();
        if state.powered_off {
            // The cut came while the fsync ran: a dead machine reports no
            // success (SQLite must not go on to acknowledge anything).
            return ffi::SQLITE_IOERR_FSYNC;
        }
        match std::fs::read(&info.path) {
            Ok(bytes) => state.sync_file(&info.path, bytes),
            Err(_) => return ffi::SQLITE_IOERR_FSYNC,
        }
        if info.new_entry.swap(false, Ordering::SeqCst) {
            state.sync_directory();
        }
    }
    rc
}

unsafe extern "C" fn io_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    if dead(file) {
        return ffi::SQLITE_IOERR_FSTAT;
    }
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xFileSize.expect("xFileSize"))(real_file(file), size) }
}

unsafe extern "C" fn io_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xLock.expect("xLock"))(real_file(file), level) }
}

unsafe extern "C" fn io_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xUnlock.expect("xUnlock"))(real_file(file), level) }
}

unsafe extern "C" fn io_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    out: *mut c_int,
) -> c_int {
    // SAFETY: forwarding.
    unsafe {
        (real_methods(file)
            .xCheckReservedLock
            .expect("xCheckReservedLock"))(real_file(file), out)
    }
}

unsafe extern "C" fn io_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    if op == ffi::SQLITE_FCNTL_SIZE_HINT && !arg.is_null() {
        // SAFETY: SQLite passes a pointer to an i64 for this op.
        let wanted = unsafe { *arg.cast::<ffi::sqlite3_int64>() };
        let rc = check_room(file, wanted.max(0) as u64);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xFileControl.expect("xFileControl"))(real_file(file), op, arg) }
}

unsafe extern "C" fn io_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xSectorSize.expect("xSectorSize"))(real_file(file)) }
}

unsafe extern "C" fn io_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: forwarding.
    unsafe {
        (real_methods(file)
            .xDeviceCharacteristics
            .expect("xDeviceCharacteristics"))(real_file(file))
    }
}

unsafe extern "C" fn io_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    if dead(file) {
        return ffi::SQLITE_IOERR_SHMMAP;
    }
    // SAFETY: forwarding.
    unsafe {
        (real_methods(file).xShmMap.expect("xShmMap"))(real_file(file), region, size, extend, out)
    }
}

unsafe extern "C" fn io_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xShmLock.expect("xShmLock"))(real_file(file), offset, n, flags) }
}

unsafe extern "C" fn io_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xShmBarrier.expect("xShmBarrier"))(real_file(file)) }
}

unsafe extern "C" fn io_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // A dead machine deletes nothing.
    let delete = if dead(file) { 0 } else { delete };
    // SAFETY: forwarding.
    unsafe { (real_methods(file).xShmUnmap.expect("xShmUnmap"))(real_file(file), delete) }
}

#[cfg(test)]
mod tests {
    //! The shim itself, on a bare connection.

    use super::*;

    fn open(dir: &FaultDir, sync: &str) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(dir.db_uri("t.db")).expect("open through the shim");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("wal");
        conn.pragma_update(None, "synchronous", sync).expect("sync");
        conn
    }

    fn reopen(cut: &PowerCut) -> (tempfile::TempDir, rusqlite::Connection) {
        let after = tempfile::tempdir().expect("tempdir");
        cut.restore_into(after.path());
        let conn = rusqlite::Connection::open(after.path().join("t.db")).expect("reopen");
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("integrity_check");
        assert_eq!(check, "ok");
        (after, conn)
    }

    #[test]
    fn powerloss_shim_keeps_synced_commits_and_drops_unsynced_ones() {
        let dir = FaultDir::new();
        let conn = open(&dir, "FULL");
        conn.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
            .expect("write");
        assert!(dir.syncs() > 0, "FULL commits sync");
        // Unsynced: NORMAL commits in WAL mode do not sync the WAL.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .expect("normal");
        conn.execute("INSERT INTO t VALUES (2)", []).expect("write");
        let cut = dir.cut_power();
        // Dead: nothing more is written.
        assert!(conn.execute("INSERT INTO t VALUES (3)", []).is_err());
        let (_after, restored) = reopen(&cut);
        let rows: Vec<i64> = restored
            .prepare("SELECT x FROM t ORDER BY x")
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(
            rows,
            vec![1],
            "the synced commit survives, the unsynced one does not"
        );
        assert!(
            !cut.images.contains_key("t.db-shm"),
            "the wal-index is volatile"
        );
    }

    #[test]
    fn powerloss_shim_writeback_keeps_what_the_kernel_flushed() {
        let dir = FaultDir::new();
        let conn = open(&dir, "NORMAL");
        conn.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
            .expect("write");
        // Everything unsynced was written back: the cut loses nothing.
        let cut = dir.cut_power_with_writeback(|_, _, _| true);
        let (_after, restored) = reopen(&cut);
        let n: i64 = restored
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 1);
    }

    /// The directory model against SQLite's documentation: in DELETE
    /// journal mode, FULL does not sync the directory after unlinking the
    /// journal, so a commit closely followed by a power loss can be rolled
    /// back by the resurrected (hot) journal; EXTRA syncs it and keeps the
    /// commit ("EXTRA provides additional durability if the commit is
    /// followed closely by a power loss", PRAGMA synchronous).
    #[test]
    fn powerloss_shim_models_the_journal_unlink_like_sqlite_documents() {
        for (sync, expected) in [("FULL", vec![1]), ("EXTRA", vec![1, 2])] {
            let dir = FaultDir::new();
            let conn = rusqlite::Connection::open(dir.db_uri("t.db")).expect("open");
            conn.pragma_update(None, "journal_mode", "DELETE")
                .expect("delete mode");
            conn.pragma_update(None, "synchronous", sync).expect("sync");
            conn.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
                .expect("first commits");
            conn.execute("INSERT INTO t VALUES (2)", [])
                .expect("last commit");
            let cut = dir.cut_power();
            let (_after, restored) = reopen(&cut);
            let rows: Vec<i64> = restored
                .prepare("SELECT x FROM t ORDER BY x")
                .expect("prepare")
                .query_map([], |r| r.get(0))
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows");
            assert_eq!(rows, expected, "synchronous={sync}");
        }
    }

    #[test]
    fn disk_full_shim_answers_sqlite_full_and_recovers() {
        let dir = FaultDir::new();
        let conn = open(&dir, "FULL");
        conn.execute_batch("CREATE TABLE t (x BLOB);")
            .expect("create");
        dir.set_quota(Some(dir.usage()));
        let err = conn
            .execute("INSERT INTO t VALUES (zeroblob(100000))", [])
            .expect_err("no room");
        assert_eq!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DiskFull),
            "{err}"
        );
        dir.set_quota(None);
        conn.execute("INSERT INTO t VALUES (zeroblob(100000))", [])
            .expect("room again");
        let n: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 1);
    }

    #[test]
    fn powerloss_shim_passes_other_directories_through() {
        let _dir = FaultDir::new();
        let other = tempfile::tempdir().expect("tempdir");
        let uri = format!(
            "file:{}?vfs={VFS_NAME}",
            other.path().join("o.db").display()
        );
        let conn = rusqlite::Connection::open(uri).expect("open");
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .expect("write");
        assert_eq!(
            conn.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                .expect("count"),
            1
        );
    }
}
