use super::*;
use std::os::fd::AsRawFd;

/// Whether descriptor number `raw` still refers to the object `id` (`st_dev`, `st_ino`):
/// a closed number may be free or reused by another test's file, never that object.
fn still_open(raw: i32, id: FileId) -> bool {
    // SAFETY: the number is only fstat-ed while borrowed, never closed or kept.
    identity(unsafe { BorrowedFd::borrow_raw(raw) }).is_ok_and(|(now, _)| now == id)
}

#[test]
fn arena_packs_parts() {
    let a: Vec<u8> = (0..100).collect();
    let b: Vec<u8> = (0..7).map(|i| 200 + i).collect();
    let parts = [
        (Some(&a[..]), 100),
        (None, 30),
        (Some(&b[..]), 7),
        (Some(&a[..]), 100),
    ];
    let (regions, places) = create(&parts, 1).unwrap();
    assert_eq!(regions.len(), 1);
    assert_eq!(places, vec![(0, 0), (0, 128), (0, 192), (0, 256)]);
    let bytes = regions[0].to_vec();
    assert_eq!(&bytes[0..100], &a[..]);
    assert!(bytes[100..192].iter().all(|&x| x == 0));
    assert_eq!(&bytes[192..199], &b[..]);
    assert_eq!(&bytes[256..356], &a[..]);
}

#[test]
fn arena_handles_many_and_large_parts() {
    let mut data: Vec<Vec<u8>> = (0..3000).map(|i| vec![(i % 251) as u8; 1 + i % 90]).collect();
    data.push(vec![7; LARGE_PART + 3]);
    data.push(vec![9; 5]);
    data.push(vec![11; 2 * LARGE_PART]);
    let parts: Vec<_> = data.iter().map(|d| (Some(&d[..]), d.len())).collect();
    let (regions, places) = create(&parts, 2).unwrap();
    assert_eq!(regions.len(), 1, "3 MiB of large parts stay with the small ones");
    let bytes = regions[0].to_vec();
    for (d, &(_, off)) in data.iter().zip(&places) {
        assert_eq!(&bytes[off..off + d.len()], &d[..]);
    }
    assert_eq!(places[3000].1 % 4096, 0);
    assert_eq!(places[3002].1 % 4096, 0);
}

#[test]
fn large_parts_spread_over_one_arena_per_writer() {
    // 5 large parts (3 of them zeros) and small ones around them, 3 writers.
    let big =
        |seed: u8, len: usize| -> Vec<u8> { (0..len).map(|i| seed.wrapping_add((i % 241) as u8)).collect() };
    let a = big(1, SPLIT_MIN + 5);
    let b = big(2, SPLIT_MIN + 4096);
    let small: Vec<Vec<u8>> = (0..50).map(|i| vec![i as u8 + 1; 1 + i * 7]).collect();
    let mut parts: Vec<(Option<&[u8]>, usize)> = small.iter().map(|d| (Some(&d[..]), d.len())).collect();
    parts.insert(10, (Some(&a[..]), a.len()));
    parts.insert(20, (None, SPLIT_MIN));
    parts.insert(30, (Some(&b[..]), b.len()));
    parts.push((None, LARGE_PART));
    parts.push((None, 3 * LARGE_PART));
    let (regions, places) = create(&parts, 3).unwrap();
    assert_eq!(regions.len(), 3);
    // every arena is its own object, with its own descriptor, in the registry
    let mut objects: Vec<_> = regions
        .iter()
        .map(|r| identity(r.fd().unwrap()).unwrap().0)
        .collect();
    objects.sort_unstable();
    objects.dedup();
    assert_eq!(objects.len(), 3);
    assert_eq!(live_count(&regions), 3);
    // small parts packed into arena 0; the largest parts each lead an arena of their own
    for (i, &(arena, _)) in places.iter().enumerate() {
        if parts[i].1 < LARGE_PART {
            assert_eq!(arena, 0, "small part {i}");
        }
    }
    assert_ne!(places[10].0, places[20].0);
    let bytes: Vec<Vec<u8>> = regions.iter().map(|r| r.to_vec()).collect();
    for (i, (&(data, len), &(arena, off))) in parts.iter().zip(&places).enumerate() {
        let got = &bytes[arena][off..off + len];
        match data {
            Some(d) => assert_eq!(got, d, "part {i}"),
            None => assert!(got.iter().all(|&x| x == 0), "part {i}"),
        }
        if len >= LARGE_PART {
            assert_eq!(off % 4096, 0);
        }
    }
    // one writer: one arena, as before
    let (one, _) = create(&parts, 1).unwrap();
    assert_eq!(one.len(), 1);
    // every page allocated (written or reserved): nothing left to fault in and fail later
    for region in regions.iter().chain(&one) {
        let st = rustix::fs::fstat(region.fd().unwrap()).unwrap();
        assert_eq!(st.st_size as usize, region.len());
        assert!(
            st.st_blocks as u64 * 512 >= st.st_size as u64,
            "a hole in the arena"
        );
    }
}

/// How many of `regions` the registry finds by their object.
fn live_count(regions: &[Arc<Region>]) -> usize {
    regions
        .iter()
        .filter(|r| {
            let (id, len) = identity(r.fd().unwrap()).unwrap();
            lookup(id, len as usize).is_some_and(|found| Arc::ptr_eq(&found, r))
        })
        .count()
}

#[test]
fn zeroed_arena_and_one_descriptor_per_arena() {
    let regions: Vec<_> = (0..16)
        .map(|_| create(&[(None, 10_000), (None, 3)], 1).unwrap().0.remove(0))
        .collect();
    assert!(regions.iter().all(|r| r.to_vec().iter().all(|&b| b == 0)));
    // One object per arena, each held by its one descriptor; all of them closed with the
    // regions. Checked by identity, not by counting the process's descriptors: tests run
    // in parallel and open their own meanwhile.
    let held: Vec<_> = regions
        .iter()
        .map(|r| {
            let fd = r.fd().expect("an arena keeps its descriptor");
            (fd.as_raw_fd(), identity(fd).unwrap().0)
        })
        .collect();
    let mut objects: Vec<_> = held.iter().map(|&(_, id)| id).collect();
    objects.sort_unstable();
    objects.dedup();
    assert_eq!(objects.len(), 16);
    drop(regions);
    for (raw, id) in held {
        assert!(!still_open(raw, id), "descriptor {raw} outlived its region");
    }
}

#[test]
fn receiving_the_same_object_maps_it_once() {
    let region = create(&[(Some(&[1, 2, 3, 4][..]), 4)], 1).unwrap().0.remove(0);
    let dup = region.fd().unwrap().try_clone_to_owned().unwrap();
    let raw = dup.as_raw_fd();
    let ours = identity(region.fd().unwrap()).unwrap().0;
    let again = receive(dup, 4).unwrap();
    assert!(Arc::ptr_eq(&region, &again));
    // Closed: the number is free now, or reused by another test's file (tests run in
    // parallel, so counting the process's descriptors would race), never still our memfd.
    assert!(!still_open(raw, ours), "the received descriptor was closed");
    // SAFETY: the region spans 4 writable bytes and nothing else touches it meanwhile.
    unsafe { *again.as_ptr() = 9 };
    assert_eq!(region.to_vec(), vec![9, 2, 3, 4]);
}

#[test]
fn received_descriptor_of_a_dropped_region_is_mapped_again() {
    let region = create(&[(Some(&[5u8; 64][..]), 64)], 1).unwrap().0.remove(0);
    let dup = region.fd().unwrap().try_clone_to_owned().unwrap();
    drop(region);
    let mapped = receive(dup, 64).unwrap();
    assert_eq!(mapped.to_vec(), vec![5u8; 64]);
    let dup = mapped.fd().unwrap().try_clone_to_owned().unwrap();
    assert!(receive(dup, 1 << 20).is_err(), "longer than the object");
}

#[cfg(target_os = "linux")]
#[test]
fn memfd_is_sealed_against_shrinking() {
    let region = create(&[(None, 8192)], 1).unwrap().0.remove(0);
    let file = File::from(region.fd().unwrap().try_clone_to_owned().unwrap());
    assert!(file.set_len(0).is_err());
    assert!(file.set_len(1 << 30).is_err());
}

#[cfg(target_os = "linux")]
#[test]
fn more_memory_than_there_is_fails_at_allocation() {
    let err = create(&[(None, usize::MAX / 4)], 1).unwrap_err();
    assert!(err.raw_os_error().is_some(), "{err}");
}
