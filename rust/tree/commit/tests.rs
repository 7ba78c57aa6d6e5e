//! Tests of `commit.rs` (kept beside it so that the module itself stays readable).

use super::*;

fn tmp() -> (PathBuf, Dir) {
    let p = std::env::temp_dir().join(format!("tdrs-commit-{}", storage::random_suffix()));
    std::fs::create_dir(&p).unwrap();
    let d = Dir::open(&p).unwrap();
    (p, d)
}

#[test]
fn replay_is_idempotent_and_touches_only_what_it_names() {
    let (p, root) = tmp();
    std::fs::write(p.join("old.memmap"), b"old").unwrap();
    std::fs::write(p.join("mine.txt"), b"mine").unwrap();
    let staging = Staging::new(&root).unwrap();
    staging.dir(0).write_new("f0", b"new", false).unwrap();
    let st = root.stat("old.memmap").unwrap().unwrap();
    let journal = Journal {
        token: staging.token.clone(),
        stagings: staging.locations(),
        ops: vec![
            Op::Mkdir {
                path: vec!["sub".into()],
            },
            Op::Rename {
                stage: 0,
                name: "f0".into(),
                to: vec!["sub".into(), "x.memmap".into()],
                id: None,
                replaces: None,
            },
            Op::Unlink {
                path: vec!["old.memmap".into()],
                dev: st.dev,
                ino: st.ino,
            },
            // a file that is not the one the journal recorded is left alone
            Op::Unlink {
                path: vec!["mine.txt".into()],
                dev: st.dev,
                ino: 0,
            },
        ],
        ..Default::default()
    };
    write_journal(&root, &staging, &journal, false).unwrap();
    // a second commit cannot get in while this journal is there
    assert!(write_journal(&root, &staging, &journal, false).is_err());
    assert!(recover(&root).unwrap());
    assert!(!recover(&root).unwrap());
    assert_eq!(std::fs::read(p.join("sub/x.memmap")).unwrap(), b"new");
    assert!(!p.join("old.memmap").exists());
    assert_eq!(std::fs::read(p.join("mine.txt")).unwrap(), b"mine");
    drop(staging); // Windows: its lock is a file in it, which keeps it until released
    let left: Vec<_> = root.entry_names().unwrap();
    assert_eq!(left, vec!["mine.txt".to_string(), "sub".to_string()]);
    std::fs::remove_dir_all(&p).unwrap();
}

#[test]
fn hostile_journals_are_refused() {
    let (p, root) = tmp();
    for ops in [
        r#"[{"op":"rename","stage":0,"name":"f0","to":["..","x"]}]"#,
        r#"[{"op":"rename","stage":0,"name":"../f0","to":["x"]}]"#,
        r#"[{"op":"rmdir","path":["a/b"]}]"#,
        r#"[{"op":"mkdir","path":[]}]"#,
        r#"[{"op":"rename","stage":3,"name":"f0","to":["x"]}]"#,
    ] {
        let text = format!(r#"{{"token":"t","stagings":[[]],"ops":{ops}}}"#);
        std::fs::write(p.join(JOURNAL), text).unwrap();
        let err = recover(&root).unwrap_err().to_string();
        assert!(err.contains("outside the tree"), "{ops}: {err}");
    }
    std::fs::remove_dir_all(&p).unwrap();
}

#[test]
fn sweep_removes_dead_staging_only() {
    let (p, root) = tmp();
    let live = Staging::new(&root).unwrap();
    live.dir(0).write_new("f1", b"x", false).unwrap();
    let dead = p.join(format!("{STAGING_PREFIX}dead"));
    std::fs::create_dir(&dead).unwrap();
    std::fs::write(dead.join("f0"), b"x").unwrap();
    std::fs::write(dead.join("user-notes"), b"mine").unwrap();
    sweep(&root);
    assert!(live.dir(0).kind("f1").unwrap() == EntryKind::File);
    // only the names a save stages are removed; a foreign file keeps the directory
    assert!(!dead.join("f0").exists());
    assert_eq!(std::fs::read(dead.join("user-notes")).unwrap(), b"mine");
    live.remove(&root);
    std::fs::remove_dir_all(&p).unwrap();
}

#[test]
fn staged_directories_move_once_and_dead_ones_are_swept() {
    let (p, root) = tmp();
    let staging = Staging::new(&root).unwrap();
    staging.dir(0).create_dir("d0").unwrap();
    staging.dir(0).create_dir("d0/inner").unwrap();
    staging
        .dir(0)
        .write_new("d0/inner/x.memmap", b"new", false)
        .unwrap();
    let journal = Journal {
        token: staging.token.clone(),
        stagings: staging.locations(),
        ops: vec![Op::Rename {
            stage: 0,
            name: "d0".into(),
            to: vec!["sub".into()],
            id: None,
            replaces: None,
        }],
        ..Default::default()
    };
    write_journal(&root, &staging, &journal, false).unwrap();
    assert!(recover(&root).unwrap());
    assert_eq!(std::fs::read(p.join("sub/inner/x.memmap")).unwrap(), b"new");
    // a staged directory never replaces one that appeared at its name
    let first = staging;
    let staging = Staging::new(&root).unwrap();
    staging.dir(0).create_dir("d0").unwrap();
    let journal = Journal {
        token: staging.token.clone(),
        stagings: staging.locations(),
        ops: vec![Op::Rename {
            stage: 0,
            name: "d0".into(),
            to: vec!["sub".into()],
            id: None,
            replaces: None,
        }],
        ..Default::default()
    };
    // (a directory without meta.json there receives the staged one's entries: here none)
    write_journal(&root, &staging, &journal, false).unwrap();
    assert!(apply(&root, journal, false, None).is_ok());
    assert!(p.join("sub/inner/x.memmap").exists());
    // a dead save's staged tree goes with its staging directory
    let dead = p.join(format!("{STAGING_PREFIX}dead"));
    std::fs::create_dir_all(dead.join("d3/a/b")).unwrap();
    std::fs::write(dead.join("d3/a/b/y.memmap"), b"x").unwrap();
    std::fs::write(dead.join("d3/meta.json"), b"{}").unwrap();
    sweep(&root);
    assert!(!dead.exists());
    // both stagings go first: on Windows their lock files live inside them until then
    drop((first, staging, root));
    std::fs::remove_dir_all(&p).unwrap();
}

/// A staged file that replaces a big file of the old tree (`reclaim::HOLD_BYTES`) is exchanged
/// with it and the old one unlinked; a replay after a kill between the two proves the step
/// done by the staged identity the target holds (it must not exchange them back), and the old
/// file goes with the staging directory. A new name is only created.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn replacing_renames_exchange_and_replay_after_the_exchange() {
    let big = crate::sys::reclaim::HOLD_BYTES as usize;
    for killed_after_exchange in [false, true] {
        let (p, root) = tmp();
        std::fs::write(p.join("x.memmap"), vec![b'o'; big]).unwrap();
        let old = root.stat("x.memmap").unwrap().unwrap();
        let staging = Staging::new(&root).unwrap();
        staging.dir(0).write_new("f0", &vec![b'n'; big], false).unwrap();
        staging.dir(0).write_new("f1", b"fresh", false).unwrap();
        let new = staging.dir(0).stat("f0").unwrap().unwrap();
        let fresh = staging.dir(0).stat("f1").unwrap().unwrap();
        let journal = Journal {
            version: JOURNAL_VERSION,
            token: staging.token.clone(),
            stagings: staging.locations(),
            ops: vec![
                Op::Rename {
                    stage: 0,
                    name: "f0".into(),
                    to: vec!["x.memmap".into()],
                    id: Some(new.id()),
                    replaces: Some(old.id()),
                },
                Op::Rename {
                    stage: 0,
                    name: "f1".into(),
                    to: vec!["y.memmap".into()],
                    id: Some(fresh.id()),
                    replaces: None,
                },
            ],
            ..Default::default()
        };
        write_journal(&root, &staging, &journal, false).unwrap();
        if killed_after_exchange {
            staging.dir(0).exchange("f0", &root, "x.memmap").unwrap();
            assert_eq!(staging.dir(0).stat("f0").unwrap().unwrap().id(), old.id());
            assert!(recover(&root).unwrap());
        } else {
            apply(&root, journal, false, Some(&staging)).unwrap();
        }
        let x = std::fs::read(p.join("x.memmap")).unwrap();
        assert!(x.len() == big && x.iter().all(|b| *b == b'n'));
        assert_eq!(std::fs::read(p.join("y.memmap")).unwrap(), b"fresh");
        assert_eq!(root.stat("x.memmap").unwrap().unwrap().id(), new.id());
        drop(staging);
        let left: Vec<_> = root.entry_names().unwrap();
        assert_eq!(left, vec!["x.memmap".to_string(), "y.memmap".to_string()]);
        crate::sys::reclaim::wait();
        std::fs::remove_dir_all(&p).unwrap();
    }
}

/// A journal without `id` or `replaces` (an older save's) still parses.
#[test]
fn journals_without_ids_still_parse() {
    let op: Op = serde_json::from_str(r#"{"op":"rename","stage":0,"name":"f0","to":["x"]}"#).unwrap();
    assert_eq!(
        op,
        Op::Rename {
            stage: 0,
            name: "f0".into(),
            to: vec!["x".into()],
            id: None,
            replaces: None
        }
    );
    let text = serde_json::to_string(&op).unwrap();
    assert!(!text.contains("replaces") && !text.contains("id"), "{text}");
}

/// The saver's own commit finds another program's meta.json at the root (written after the
/// plan read the old one, as tensordict writes without a lock): the commit is superseded
/// before it moves anything, so that program's tree stays whole (the data files too), and the
/// journal and staging go.
#[test]
fn a_root_meta_replaced_after_the_plan_supersedes_before_any_move() {
    let (p, root) = tmp();
    std::fs::write(p.join("meta.json"), b"{\"old\": 1}").unwrap();
    std::fs::write(p.join("x.memmap"), b"old").unwrap();
    let read = |name: &str| {
        let st = root.stat(name).unwrap().unwrap();
        FileState::of(Stamp::from(st), &std::fs::read(p.join(name)).unwrap())
    };
    let old_meta = read("meta.json");
    let old_x = root.stat("x.memmap").unwrap().unwrap();
    let staging = Staging::new(&root).unwrap();
    staging.dir(0).write_new("f0", b"new", false).unwrap();
    staging.dir(0).write_new("m0", b"{\"new\": 1}", false).unwrap();
    let f0 = staging.dir(0).stat("f0").unwrap().unwrap();
    let m0 = staging.dir(0).stat("m0").unwrap().unwrap();
    let journal = Journal {
        version: JOURNAL_VERSION,
        token: staging.token.clone(),
        stagings: staging.locations(),
        ops: vec![
            Op::Aside { name: "a0".into() },
            Op::Rename {
                stage: 0,
                name: "f0".into(),
                to: vec!["x.memmap".into()],
                id: Some(f0.id()),
                replaces: Some(old_x.id()),
            },
            Op::Rename {
                stage: 0,
                name: "m0".into(),
                to: vec!["meta.json".into()],
                id: Some(m0.id()),
                replaces: None,
            },
        ],
        dirs: vec![DirState {
            path: Vec::new(),
            old: Some(old_meta),
            new: Some(FileState::of(Stamp::from(m0), b"{\"new\": 1}")),
        }],
        ..Default::default()
    };
    write_journal(&root, &staging, &journal, false).unwrap();
    // another program's tree: its meta.json replaces the old one (a new file renamed over it)
    std::fs::write(p.join("theirs"), b"{\"theirs\": 1}").unwrap();
    std::fs::rename(p.join("theirs"), p.join("meta.json")).unwrap();
    assert!(matches!(
        apply(&root, journal, false, Some(&staging)).unwrap(),
        Finished::Superseded
    ));
    assert_eq!(std::fs::read(p.join("meta.json")).unwrap(), b"{\"theirs\": 1}");
    assert_eq!(std::fs::read(p.join("x.memmap")).unwrap(), b"old");
    drop(staging);
    let left: Vec<_> = root.entry_names().unwrap();
    assert_eq!(left, vec!["meta.json".to_string(), "x.memmap".to_string()]);
    std::fs::remove_dir_all(&p).unwrap();
}
