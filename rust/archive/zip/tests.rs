use super::*;
use crate::archive::tests::{opts, sample, tmp};
use crate::archive::{is_archive, load_archive, write_archive, Compression};

#[test]
fn hostile_names_are_refused() {
    for name in ["../x", "/abs", "a/../b", "a\\b", "C:/x", "a//b", "."] {
        assert!(check_name(Path::new("x"), name).is_err(), "{name}");
    }
    for name in ["meta.json", "a/b.memmap", "dir/", "%2E%2E/meta.json"] {
        assert!(check_name(Path::new("x"), name).is_ok(), "{name}");
    }
}

#[test]
fn truncated_and_garbage_files_are_refused() {
    let data = vec![vec![1u8; 12], vec![2u8; 6]];
    let (root, leaves) = sample(&data);
    let path = tmp("t.tdz");
    write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
        let p = tmp("cut.tdz");
        std::fs::write(&p, &bytes[..cut]).unwrap();
        assert!(load_archive(&p, MapMode::CopyOnWrite).is_err(), "cut at {cut}");
        assert!(!is_archive(&p));
    }
}

#[test]
fn deflate_bombs_are_refused() {
    let e = ZipEntry {
        name: "a.memmap".into(),
        method: DEFLATED,
        flags: 0,
        crc: 0,
        csize: 10,
        size: 1 << 40,
        header: 0,
        data: 0,
        central: 0,
    };
    let path = tmp("bomb.tdz");
    let data = vec![vec![1u8; 12], vec![2u8; 6]];
    let (root, leaves) = sample(&data);
    write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
    let ar = Archive::open(&path, MapMode::ReadOnly).unwrap();
    let err = ar.inflate(&e).unwrap_err().to_string();
    assert!(err.contains("zip bomb"), "{err}");
}
