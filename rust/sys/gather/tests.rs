use super::*;

fn addr(v: &[u8]) -> usize {
    v.as_ptr() as usize
}

#[test]
fn gathers_rows_in_runs() {
    let src: Vec<u8> = (0..40).collect(); // 10 rows of 4 bytes
    let mut dst = vec![0u8; 6 * 4];
    let mut copies = Vec::new();
    let d = dst.as_mut_ptr() as usize;
    row_copies(&[2, 3, 4, -1, 0, 0], 10, 4, addr(&src), d, &mut copies).unwrap();
    assert_eq!(copies.len(), 4, "2,3,4 is one run; 0,0 are two copies");
    // SAFETY: src and dst live for the call and do not overlap.
    unsafe { run(&copies, true) };
    let rows: Vec<u8> = [2, 3, 4, 9, 0, 0]
        .iter()
        .flat_map(|&r| r * 4..r * 4 + 4)
        .collect();
    assert_eq!(dst, rows);
}

#[test]
fn refuses_out_of_range_rows() {
    let mut copies = Vec::new();
    assert_eq!(row_copies(&[0, 10], 10, 4, 0, 0, &mut copies), Err(10));
    assert_eq!(row_copies(&[-11], 10, 4, 0, 0, &mut copies), Err(-11));
    assert_eq!(row_copies(&[i64::MIN], 10, 0, 0, 0, &mut copies), Err(i64::MIN));
}

#[test]
fn parallel_copies_match() {
    let src: Vec<u8> = (0..(3 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let s = addr(&src);
    let d = dst.as_mut_ptr() as usize;
    let copies: Vec<Copy> = (0..3)
        .map(|k| Copy {
            src: s + (k << 20),
            dst: d + ((2 - k) << 20),
            len: 1 << 20,
        })
        .collect();
    // SAFETY: both vectors live for the call and do not overlap.
    unsafe { run(&copies, true) };
    for k in 0..3 {
        assert_eq!(dst[(2 - k) << 20..(3 - k) << 20], src[k << 20..(k + 1) << 20]);
    }
}

#[test]
fn parallel_jobs_from_many_threads_all_finish_right() {
    // Jobs posted from several threads at once replace each other in the helpers' slot:
    // each caller must still see all of its own copies done when `run` returns.
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            std::thread::spawn(move || {
                for round in 0..20u8 {
                    let fill = t.wrapping_mul(31).wrapping_add(round);
                    let src = vec![fill; 2 << 20];
                    let mut dst = vec![0u8; 2 << 20];
                    let copies = vec![Copy {
                        src: addr(&src),
                        dst: dst.as_mut_ptr() as usize,
                        len: src.len(),
                    }];
                    // SAFETY: both vectors live for the call and do not overlap.
                    unsafe { run(&copies, true) };
                    assert!(dst.iter().all(|&b| b == fill), "thread {t} round {round}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn quiet_and_lingering_jobs_mixed_all_finish_right() {
    // Helpers that went to sleep after a quiet job must wake for the next post of either
    // kind, from any thread; every caller sees its own copies done.
    let handles: Vec<_> = (0..3u8)
        .map(|t| {
            std::thread::spawn(move || {
                for round in 0..30u8 {
                    let fill = t.wrapping_mul(17).wrapping_add(round);
                    let src = vec![fill; 1 << 20];
                    let mut dst = vec![0u8; 1 << 20];
                    let copies = vec![Copy {
                        src: addr(&src),
                        dst: dst.as_mut_ptr() as usize,
                        len: src.len(),
                    }];
                    // SAFETY: both vectors live for the call and do not overlap.
                    unsafe {
                        if (round + t) % 2 == 0 {
                            run_quiet(&copies, true)
                        } else {
                            run(&copies, true)
                        }
                    };
                    assert!(dst.iter().all(|&b| b == fill), "thread {t} round {round}");
                    if round % 7 == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        // helpers fall asleep
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn small_rows_stay_on_one_thread_but_are_copied() {
    // 8192 copies of 64 bytes: 512 KiB in all, but none counts as bulk.
    let src: Vec<u8> = (0..(1 << 20)).map(|i| (i % 253) as u8).collect();
    let mut dst = vec![0u8; 8192 * 64];
    let index: Vec<i64> = (0..8192).map(|k| (k * 7919 % 16384) as i64).collect();
    let mut copies = Vec::new();
    let d = dst.as_mut_ptr() as usize;
    row_copies(&index, 16384, 64, addr(&src), d, &mut copies).unwrap();
    assert!(copies.iter().all(|c| c.len < BULK_MIN));
    // SAFETY: src and dst live for the call and do not overlap.
    unsafe { run(&copies, true) };
    for (k, &i) in index.iter().enumerate() {
        let i = i as usize;
        assert_eq!(dst[k * 64..k * 64 + 64], src[i * 64..i * 64 + 64]);
    }
}

#[test]
fn prepare_is_harmless_without_a_job() {
    for _ in 0..100 {
        pool::prepare();
    }
    let src = vec![5u8; 1 << 20];
    let mut dst = vec![0u8; 1 << 20];
    let copies = [Copy {
        src: addr(&src),
        dst: dst.as_mut_ptr() as usize,
        len: 1 << 20,
    }];
    // SAFETY: both vectors live for the call and do not overlap.
    unsafe { run(&copies, true) };
    assert!(dst.iter().all(|&b| b == 5));
}

#[test]
fn classifies_overlaps() {
    assert_eq!(check(&[(0, 10), (10, 5)], &[(100, 50)]), Overlap::None);
    assert_eq!(check(&[(0, 10), (9, 5)], &[(100, 50)]), Overlap::Destinations);
    assert_eq!(
        check(&[(0, 10)], &[(100, 50), (5, 1)]),
        Overlap::SourceAndDestination
    );
    assert_eq!(check(&[(0, 10)], &[(10, 5), (12, 100)]), Overlap::None);
    assert_eq!(
        check(&[(5, 0), (5, 10)], &[(5, 0)]),
        Overlap::None,
        "empty ranges never overlap"
    );
}

#[test]
fn splits_into_pieces() {
    let p = pieces(
        &[Copy {
            src: 0,
            dst: 1000,
            len: 10,
        }],
        4,
    );
    assert_eq!(p.iter().map(|c| c.len).collect::<Vec<_>>(), vec![4, 4, 2]);
    assert_eq!(
        p[2],
        Copy {
            src: 8,
            dst: 1008,
            len: 2
        }
    );
}
