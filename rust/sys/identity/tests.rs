use std::fs::File;

use super::*;
use crate::sys::storage::random_suffix;

#[test]
fn every_way_of_asking_names_the_same_file() {
    let dir = std::env::temp_dir().join(format!("tdrs-identity-{}", random_suffix()));
    std::fs::create_dir(&dir).unwrap();
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::fs::write(&a, b"a").unwrap();
    std::fs::write(&b, b"b").unwrap();
    let file = File::open(&a).unwrap();
    let id = of_file(&file).unwrap();
    assert_eq!(of_path(&a).unwrap(), id);
    assert_ne!(of_path(&b).unwrap(), id, "two files, two identities");
    assert_ne!(id.1, 0, "a real file index, not a placeholder");
    if cfg!(unix) {
        assert_eq!(of_metadata(&file.metadata().unwrap()), Some(id));
    } else {
        assert_eq!(of_metadata(&file.metadata().unwrap()), None);
    }
    // A file moved over the name is another file; the moved one keeps its identity.
    drop(file);
    std::fs::rename(&b, &a).unwrap();
    assert_ne!(of_path(&a).unwrap(), id);
    // A directory has one too, the same through its path and an open handle.
    let sub = crate::sys::dir::Dir::open(&dir).unwrap();
    assert_eq!(sub.identity().unwrap(), of_path(&dir).unwrap());
    drop(sub);
    std::fs::remove_dir_all(&dir).unwrap();
}
