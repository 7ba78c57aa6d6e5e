use super::*;

fn new_file(base: &std::path::Path) -> (std::path::PathBuf, File) {
    let p = base.join(format!("tdrs-prealloc-{}", crate::sys::storage::random_suffix()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    (p, f)
}

/// The policy: nothing for an empty file or below the size, `never` and `always` as said.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn the_policy_decides_by_size_and_setting() {
    let (p, f) = new_file(&std::env::temp_dir());
    let disk = helps_on(&f, PREALLOCATE_BYTES);
    assert!(!decide(Policy::Auto, &f, 0));
    assert!(!decide(Policy::Always, &f, 0));
    assert!(!decide(Policy::Auto, &f, PREALLOCATE_BYTES - 1));
    assert_eq!(decide(Policy::Auto, &f, PREALLOCATE_BYTES), disk);
    assert!(decide(Policy::Always, &f, 1));
    assert!(!decide(Policy::Never, &f, PREALLOCATE_BYTES));
    drop(f);
    std::fs::remove_file(&p).unwrap();
}

/// tmpfs is a memory file system: preallocated by the automatic choice only for a file larger
/// than half of the free memory.
#[cfg(target_os = "linux")]
#[test]
fn tmpfs_is_preallocated_only_past_half_the_free_memory() {
    let shm = std::path::Path::new("/dev/shm");
    let Ok(st) = rustix::fs::statfs(shm) else { return };
    #[allow(clippy::unnecessary_cast)]
    if st.f_type as i64 != 0x0102_1994 {
        return; // no tmpfs there on this machine
    }
    let free = free_memory().unwrap();
    assert!(free > 0);
    let (p, f) = new_file(shm);
    assert!(!helps_on(&f, PREALLOCATE_BYTES.min(free as usize / 4)));
    assert!(!decide(Policy::Auto, &f, (free / 4) as usize));
    assert!(decide(Policy::Auto, &f, (free as usize).saturating_mul(2)));
    drop(f);
    std::fs::remove_file(&p).unwrap();
}

/// Where it is wanted, the file gets its size and all its blocks; the write that follows
/// fills it; elsewhere nothing changes. A range does the same for its part only.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn a_preallocated_file_has_its_blocks_before_the_write() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let (p, f) = new_file(&std::env::temp_dir());
    let len = PREALLOCATE_BYTES;
    let did = preallocate(&f, len).unwrap();
    let md = f.metadata().unwrap();
    if did {
        assert_eq!(md.len(), len as u64);
        assert!(md.blocks() * 512 >= len as u64);
    } else {
        assert_eq!(md.len(), 0);
    }
    f.write_all_at(&[7u8; 4096], 0).unwrap();
    let mut back = [0u8; 4096];
    f.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, [7u8; 4096]);
    drop(f);
    std::fs::remove_file(&p).unwrap();

    let (p, f) = new_file(&std::env::temp_dir());
    f.set_len(len as u64 + 8192).unwrap();
    let did = preallocate_range(&f, 4096, len as u64, len).unwrap();
    let md = f.metadata().unwrap();
    assert_eq!(md.len(), len as u64 + 8192); // the size is the caller's
    if did {
        assert!(md.blocks() * 512 >= len as u64);
    }
    assert!(!preallocate_range(&f, 0, 0, len).unwrap());
    drop(f);
    std::fs::remove_file(&p).unwrap();
}
