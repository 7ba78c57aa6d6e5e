use super::*;

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tdrs-staging-{}-{}",
        std::process::id(),
        storage::random_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn staging_names_are_exact() {
    let own = staging_name("t.tdz");
    assert_eq!(staging_pid(&own, "t.tdz"), Some(std::process::id()));
    for name in [
        ".t.tdz.tdrs-12-0123456789abcdef0",
        ".t.tdz.tdrs-12-0123456789abcdeg",
        ".t.tdz.tdrs--0123456789abcdef",
        ".t.tdz.tdrs-x1-0123456789abcdef",
        "t.tdz.tdrs-12-0123456789abcdef",
        ".u.tdz.tdrs-12-0123456789abcdef",
    ] {
        assert_eq!(staging_pid(name, "t.tdz"), None, "{name}");
    }
}

/// A live writer's staging file is kept whatever its pid says (here a pid no process has,
/// as a writer on another machine would show); a dead one's is removed even when its pid
/// is a live process's (pid 1, as a reused pid would be); nothing else is touched.
#[test]
fn only_unlocked_staging_files_are_swept() {
    let target = tmp("t.tdz");
    let dir = target.parent().unwrap().to_path_buf();
    let name = |pid: u32, suffix: &str| format!(".t.tdz.tdrs-{pid}-{suffix}");
    let live = name(2_147_483_000, "00000000000000aa"); // no such process
    let dead = name(1, "00000000000000bb");
    let own = name(std::process::id(), "00000000000000cc");
    std::fs::write(dir.join(&live), b"live").unwrap();
    std::fs::write(dir.join(&dead), b"dead").unwrap();
    std::fs::write(dir.join(&own), b"own").unwrap();
    let holder = File::open(dir.join(&live)).unwrap();
    assert!(lock_file(&holder, false).unwrap());
    // The user's files: near-miss names, a symlink and a directory with staging names.
    let user = [
        ".t.tdz.tdrs-12-0123456789abcdef0",
        ".t.tdz.tdrs-x-0123456789abcdef",
        ".u.tdz.tdrs-12-0123456789abcdef",
        "notes.txt",
    ];
    for n in user {
        std::fs::write(dir.join(n), n).unwrap();
    }
    let link = name(2, "00000000000000dd");
    std::os::unix::fs::symlink(dir.join("notes.txt"), dir.join(&link)).unwrap();
    let sub = name(3, "00000000000000ee");
    std::fs::create_dir(dir.join(&sub)).unwrap();

    let parent = Dir::open(&dir).unwrap();
    sweep_stale(&parent, "t.tdz");
    assert!(
        dir.join(&live).exists(),
        "a live writer's staging file was removed"
    );
    assert!(!dir.join(&dead).exists(), "a dead writer's staging file was kept");
    assert!(dir.join(&own).exists(), "this process's own pid is never swept");
    for n in user {
        assert_eq!(std::fs::read(dir.join(n)).unwrap(), n.as_bytes(), "{n}");
    }
    assert!(std::fs::symlink_metadata(dir.join(&link)).unwrap().is_symlink());
    assert!(dir.join(&sub).is_dir());

    drop(holder); // the writer dies: its lock goes with it
    sweep_stale(&parent, "t.tdz");
    assert!(!dir.join(&live).exists());
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| staging_pid(n, "t.tdz").is_some_and(|p| p != std::process::id()))
        .collect();
    left.sort();
    assert_eq!(left, [link, sub]);
}

/// While a save runs, its staging file is locked: another open cannot take the lock.
#[test]
fn the_staging_file_is_locked_while_written() {
    let target = tmp("w.tdz");
    let parent = Dir::open(target.parent().unwrap()).unwrap();
    let (name, file) = create_staging(&parent, "w.tdz").unwrap();
    let other = File::open(parent.child_path(&name)).unwrap();
    assert!(!lock_file(&other, false).unwrap());
    drop(file);
    assert!(lock_file(&other, false).unwrap());
}
