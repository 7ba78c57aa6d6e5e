//! Tests of what only Windows has, run under Wine by `.ci/windows`: pagefile-backed anonymous
//! maps, the commit of a save (journal, lock files, no-replace renames, mapped files moved
//! aside) and its recovery after a process killed at each step, reserved and case-folded names.

use std::path::{Path, PathBuf};
use std::process::Command;

use windows_sys::Win32::System::Memory::{VirtualQuery, MEMORY_BASIC_INFORMATION, MEM_COMMIT, MEM_MAPPED};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, GetProcessHandleCount};

use crate::sys::anon;
use crate::sys::dir::{self, Dir};
use crate::sys::storage::{self, Region};
use crate::tree::commit;
use crate::tree::load::{self, LoadedEntry};
use crate::tree::save::{write_file, write_tree, EntrySpec, LeafSpec, NodeSpec, SaveOptions};

fn query(ptr: *const u8) -> MEMORY_BASIC_INFORMATION {
    // SAFETY: the struct is plain old data; zeroed is a valid initial value.
    let mut info: MEMORY_BASIC_INFORMATION = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<MEMORY_BASIC_INFORMATION>();
    // SAFETY: VirtualQuery only reads the address space; `info` is a valid out-pointer.
    let written = unsafe { VirtualQuery(ptr.cast(), &mut info, size) };
    assert_eq!(written, size);
    info
}

fn handle_count() -> u32 {
    let mut count = 0;
    // SAFETY: the pseudo-handle of this process needs no closing; `count` is a valid out-pointer.
    let ok = unsafe { GetProcessHandleCount(GetCurrentProcess(), &mut count) };
    assert_ne!(ok, 0);
    count
}

#[test]
fn pagefile_map_is_created_written_read_back_and_freed() {
    let len = 24 << 20 | 4096;
    let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    let region = anon::anonymous(Some(&data), len).unwrap();
    let base = region.as_ptr();
    let info = query(base);
    assert_eq!((info.Type, info.State), (MEM_MAPPED, MEM_COMMIT));
    assert!(info.RegionSize >= len);
    assert!(region.path().is_none() && region.writable());
    assert_eq!(region.to_vec(), data);
    // SAFETY: the region spans `len` writable bytes and is alive.
    unsafe { *base.add(len - 1) = 7 };
    assert_eq!(region.to_vec()[len - 1], 7);
    region.flush().unwrap();
    drop(region);
    // Unmapped: the address is free, or (another thread's) smaller map starts there now.
    let after = query(base);
    assert!(after.Type != MEM_MAPPED || after.RegionSize < len, "still mapped");

    let zeroed = anon::anonymous(None, 10_000).unwrap();
    assert!(zeroed.to_vec().iter().all(|&b| b == 0));
}

#[test]
fn anonymous_maps_and_arenas_keep_no_handle() {
    let before = handle_count();
    let maps: Vec<_> = (0..256).map(|_| anon::anonymous(None, 4096).unwrap()).collect();
    let a = [1u8; 100];
    let arenas: Vec<_> = (0..64)
        .map(|_| anon::create(&[(Some(&a[..]), 100), (None, 30)], 1).unwrap())
        .collect();
    let after = handle_count();
    assert!(after < before + 32, "{before} -> {after} handles for 320 maps");
    let (arena, places) = &arenas[0];
    assert_eq!((arena.len(), places.as_slice()), (1, &[(0, 0), (0, 128)][..]));
    assert_eq!(&arena[0].to_vec()[..100], &a[..]);
    drop((maps, arenas));
}

fn tmp() -> PathBuf {
    let p = std::env::temp_dir().join(format!("tdrs-win-{}", storage::random_suffix()));
    std::fs::create_dir(&p).unwrap();
    p
}

fn opts() -> SaveOptions {
    SaveOptions {
        existsok: true,
        durable: true,
        num_threads: 2,
        ..Default::default()
    }
}

fn leaf(data: &[u8]) -> LeafSpec<'_> {
    LeafSpec {
        dtype: "torch.uint8".into(),
        shape: vec![data.len() as u64],
        device: "cpu".into(),
        data: Some(data),
        nbytes: data.len(),
        same_file: None,
        nested: None,
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn one_leaf_tree() -> NodeSpec {
    NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("x".into(), EntrySpec::Leaf(0))],
    }
}

fn bytes(region: &Option<Region>) -> Vec<u8> {
    region.as_ref().unwrap().to_vec()
}

#[test]
fn lock_files_exclude_each_other_and_go_with_the_lock() {
    let p = tmp();
    let a = Dir::open(&p).unwrap();
    let b = Dir::open(&p).unwrap();
    assert!(a.lock(true, false).unwrap());
    assert_eq!(names(&p), [dir::LOCK_FILE]);
    // another handle (of this process, as of any other) is refused while it is held
    assert!(!b.lock(true, false).unwrap());
    a.unlock();
    assert!(names(&p).is_empty());
    assert!(b.lock(true, false).unwrap());
    assert!(!a.lock(true, false).unwrap());
    // a lock file left by a killed process is taken over
    drop(b);
    std::fs::write(p.join(dir::LOCK_FILE), b"").unwrap();
    assert!(a.lock(true, true).unwrap());
    a.unlock();
    assert!(names(&p).is_empty());
    // the no-replace rename of the commit point: one winner, the loser changes nothing
    std::fs::write(p.join("one"), b"1").unwrap();
    std::fs::write(p.join("two"), b"2").unwrap();
    let err = a.rename("one", &a, "two", true).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(p.join("two")).unwrap(), b"2");
    a.rename("one", &a, "three", true).unwrap();
    assert_eq!(names(&p), ["three", "two"]);
    // identities tell files apart and follow a file across a rename
    let three = a.stat("three").unwrap().unwrap();
    let two = a.stat("two").unwrap().unwrap();
    assert_ne!((three.dev, three.ino), (two.dev, two.ino));
    a.rename("three", &a, "four", false).unwrap();
    let four = a.stat("four").unwrap().unwrap();
    assert_eq!((four.dev, four.ino), (three.dev, three.ino));
    std::fs::remove_dir_all(&p).unwrap();
}

#[test]
fn a_save_over_mapped_leaves_moves_them_aside_and_keeps_user_files() {
    let dir = tmp();
    let prefix = dir.join("td");
    let held = write_tree(&prefix, &one_leaf_tree(), &[leaf(&[1, 2, 3])], opts()).unwrap();
    std::fs::write(prefix.join("notes.txt"), b"mine").unwrap();
    let loaded = load::load_tree(&prefix).unwrap().1;
    // Both maps of the old file are alive: Windows can neither delete nor replace it.
    let regions = write_tree(&prefix, &one_leaf_tree(), &[leaf(&[4, 5, 6])], opts()).unwrap();
    assert_eq!(bytes(&regions[0]), [4, 5, 6]);
    assert_eq!(std::fs::read(prefix.join("x.memmap")).unwrap(), [4, 5, 6]);
    assert_eq!(std::fs::read(prefix.join("notes.txt")).unwrap(), b"mine");
    // the holders keep the old bytes, as on Linux
    assert_eq!(bytes(&held[0]), [1, 2, 3]);
    assert_eq!(bytes(&loaded[0]), [1, 2, 3]);
    let after = names(&prefix);
    let aside: Vec<_> = after
        .iter()
        .filter(|n| n.starts_with(commit::STAGING_PREFIX))
        .collect();
    assert_eq!(aside.len(), 1, "{after:?}");
    assert_eq!(names(&prefix.join(aside[0])).len(), 1);
    assert!(load::verify_tree(&prefix).is_empty());
    // once unmapped, the next save's sweep deletes the old file and its directory
    drop((held, loaded));
    let regions2 = write_tree(&prefix, &one_leaf_tree(), &[leaf(&[7, 8, 9])], opts()).unwrap();
    // `regions` still maps the file just replaced: it waits aside in turn
    drop(regions);
    drop(regions2);
    drop(write_tree(&prefix, &one_leaf_tree(), &[leaf(&[7, 8, 9])], opts()).unwrap());
    assert_eq!(names(&prefix), ["meta.json", "notes.txt", "x.memmap"]);
    assert_eq!(names(&dir), ["td"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Old and new tree of the crash test: the new one rewrites `x` and `sub/y`, adds `z` and
/// drops `old`, so its journal renames, creates nothing, and unlinks.
fn crash_tree(new: bool) -> (NodeSpec, Vec<Vec<u8>>) {
    let v = u8::from(new) + 1;
    let sub = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("y".into(), EntrySpec::Leaf(1))],
    };
    let mut entries = vec![
        ("x".into(), EntrySpec::Leaf(0)),
        ("sub".into(), EntrySpec::Node(sub)),
    ];
    entries.push(if new {
        ("z".into(), EntrySpec::Leaf(2))
    } else {
        ("old".into(), EntrySpec::Leaf(2))
    });
    let data = vec![vec![v; 4], vec![v + 10; 5], vec![v + 20; 6]];
    (
        NodeSpec {
            class: None,
            batch: vec![],
            entries,
        },
        data,
    )
}

fn save_crash_tree(prefix: &Path, new: bool) {
    let (root, data) = crash_tree(new);
    let leaves: Vec<_> = data.iter().map(|d| leaf(d)).collect();
    drop(write_tree(prefix, &root, &leaves, opts()).unwrap());
}

/// The tree at `prefix` is the whole new version (loaded, then checked file by file).
fn assert_new_version(prefix: &Path) {
    let (node, regions) = load::load_tree(prefix).unwrap();
    let keys: Vec<_> = node.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["x", "sub", "z"]);
    let (_, data) = crash_tree(true);
    let mut got: Vec<_> = regions.iter().map(bytes).collect();
    got.sort();
    let mut want = data.clone();
    want.sort();
    assert_eq!(got, want);
    drop(regions);
    assert!(load::verify_tree(prefix).is_empty());
    assert_eq!(std::fs::read(prefix.join("x.memmap")).unwrap(), data[0]);
    assert_eq!(
        std::fs::read(prefix.join("sub").join("y.memmap")).unwrap(),
        data[1]
    );
    assert!(!prefix.join("old.memmap").exists());
}

fn crash_child(mode: &str, prefix: &Path, step: usize) -> std::process::ExitStatus {
    // The test's name as the harness knows it: its module path without the crate's name (a
    // name that matches no test would run nothing and exit 0).
    let (_, module) = module_path!().split_once("::").unwrap();
    let test = format!("{module}::killed_commits_are_finished_at_every_step");
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test.as_str()])
        .args(["--test-threads=1", "-q"])
        .env("TDRS_WIN_CRASH", format!("{mode}:{}", prefix.display()))
        .env("TENSORDICT_RS_KILL_AT_STEP", step.to_string())
        .output()
        .unwrap()
        .status
}

/// A save killed (a real process kill: abort, no cleanup) at every step of its commit, then
/// finished by the next load or save; every other round the recovery is killed once too.
#[test]
fn killed_commits_are_finished_at_every_step() {
    if let Ok(job) = std::env::var("TDRS_WIN_CRASH") {
        // The killed child: `TENSORDICT_RS_KILL_AT_STEP` ends it inside the commit.
        let (mode, prefix) = job.split_once(':').unwrap();
        match mode {
            "save" => save_crash_tree(Path::new(prefix), true),
            _ => drop(load::load_tree(Path::new(prefix)).unwrap()),
        }
        std::process::exit(3); // not killed: the parent sees this and fails
    }
    // 3 renames of data files, 2 of meta.json files, 1 unlink, then the journal's removal
    let steps = 7;
    for step in 0..steps {
        let dir = tmp();
        let prefix = dir.join("td");
        save_crash_tree(&prefix, false);
        std::fs::write(prefix.join("notes.txt"), b"mine").unwrap();
        let status = crash_child("save", &prefix, step);
        assert!(
            !status.success() && status.code() != Some(3),
            "step {step}: {status:?}"
        );
        assert!(prefix.join(commit::JOURNAL).exists(), "step {step}");
        if step % 2 == 1 {
            // the recovery itself is killed one step further on
            let status = crash_child("load", &prefix, step + 1);
            assert!(
                !status.success() && status.code() != Some(3),
                "step {step}: {status:?}"
            );
            assert!(prefix.join(commit::JOURNAL).exists(), "step {step}");
        }
        if step % 3 == 0 {
            save_crash_tree(&prefix, true);
        }
        // finished by that save or by this load; nothing of the commit (journal, staging
        // directories, the dead processes' lock files) is left, the user's file is kept
        assert_new_version(&prefix);
        let left = ["meta.json", "notes.txt", "sub", "x.memmap", "z.memmap"];
        assert_eq!(names(&prefix), left, "step {step}");
        assert_eq!(names(&prefix.join("sub")), ["meta.json", "y.memmap"]);
        assert_eq!(std::fs::read(prefix.join("notes.txt")).unwrap(), b"mine");
        save_crash_tree(&prefix, true);
        assert_eq!(names(&prefix), left, "step {step}");
        assert_new_version(&prefix);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn single_files_are_written_whole_and_leave_no_temporary_name() {
    let dir = tmp();
    let path = dir.join("t.memmap");
    let region = write_file(&path, Some(&[1, 2, 3]), 3, false).unwrap();
    assert_eq!(names(&dir), ["t.memmap"]);
    assert_eq!(std::fs::read(&path).unwrap(), [1, 2, 3]);
    // exclusive without existsok; with it, the mapped old file cannot be replaced on
    // Windows: an error, the old file kept, no temporary file left
    assert!(write_file(&path, Some(&[4, 5, 6]), 3, false).is_err());
    assert!(write_file(&path, Some(&[4, 5, 6]), 3, true).is_err());
    assert_eq!(names(&dir), ["t.memmap"]);
    assert_eq!(bytes(&Some(region)), [1, 2, 3]);
    let region = write_file(&path, Some(&[4, 5, 6]), 3, true).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), [4, 5, 6]);
    assert_eq!(names(&dir), ["t.memmap"]);
    drop(region);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reserved_names_stay_out_of_file_names() {
    let keys = ["CON", "nul", "a:b", "x.", "y ", "COM1", "lpt9.txt", "AUX."];
    let data: Vec<Vec<u8>> = (0..=keys.len()).map(|i| vec![i as u8; 3]).collect();
    let leaves: Vec<_> = data.iter().map(|b| leaf(b)).collect();
    let child = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("PRN".into(), EntrySpec::Leaf(keys.len()))],
    };
    let mut entries: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_string(), EntrySpec::Leaf(i)))
        .collect();
    entries.push(("NUL".into(), EntrySpec::Node(child)));
    entries.push(("dot.".into(), EntrySpec::NonTensor("v".into())));
    let root = NodeSpec {
        class: None,
        batch: vec![],
        entries,
    };
    let dir = tmp();
    let prefix = dir.join("td");
    drop(write_tree(&prefix, &root, &leaves, opts()).unwrap());
    assert_eq!(
        names(&prefix),
        [
            "%41UX..memmap",
            "%43OM1.memmap",
            "%43ON.memmap",
            "%4EUL",
            "%6Cpt9.txt.memmap",
            "%6Eul.memmap",
            "a%3Ab.memmap",
            "dot%2E",
            "meta.json",
            "x..memmap",
            "y%20.memmap",
        ]
    );
    assert_eq!(names(&prefix.join("%4EUL")), ["%50RN.memmap", "meta.json"]);
    let (node, regions) = load::load_tree(&prefix).unwrap();
    for (i, key) in keys.iter().enumerate() {
        let (_, entry) = node.entries.iter().find(|(k, _)| k == key).unwrap();
        let LoadedEntry::Leaf { index, .. } = entry else {
            panic!("{key:?} is not a leaf")
        };
        assert_eq!(regions[*index].as_ref().unwrap().to_vec(), data[i], "{key:?}");
    }
    let (_, nul) = node.entries.iter().find(|(k, _)| k == "NUL").unwrap();
    let LoadedEntry::Node(nul) = nul else {
        panic!("NUL is not a node")
    };
    let (key, LoadedEntry::Leaf { index, .. }) = &nul.entries[0] else {
        panic!("PRN is not a leaf")
    };
    assert_eq!((key.as_str(), bytes(&regions[*index])), ("PRN", vec![8; 3]));
    let (_, dot) = node.entries.iter().find(|(k, _)| k == "dot.").unwrap();
    assert!(matches!(dot, LoadedEntry::NonTensor(v, _) if v == "v"));
    assert!(load::verify_tree(&prefix).is_empty());
    drop(regions);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn keys_that_differ_only_in_case_are_refused() {
    let dir = tmp();
    let prefix = dir.join("td");
    let root = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("a".into(), EntrySpec::Leaf(0)), ("A".into(), EntrySpec::Leaf(1))],
    };
    let err = write_tree(&prefix, &root, &[leaf(&[1]), leaf(&[2])], opts()).unwrap_err();
    assert!(err.to_string().contains("\"A\""), "{err}");
    let meta = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("META.JSON".into(), EntrySpec::NonTensor(1.into()))],
    };
    assert!(write_tree(&prefix, &meta, &[], opts()).is_err());
    // nothing was written, and the directory made for the save is gone again
    assert!(!prefix.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
