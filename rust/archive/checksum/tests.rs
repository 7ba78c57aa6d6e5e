use super::*;
use crate::archive::zip::crc32;

fn bytes(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Big entries are cut into page-aligned ranges that cover them exactly, one per worker at
/// most; small ones (and empty ones) stay whole.
#[test]
fn pieces_cover_every_entry_in_order() {
    let lens = [0, 100, RANGE_BYTES, 3 * RANGE_BYTES + 12_345, RANGE_BYTES - 1];
    for workers in [1, 2, 3, 8] {
        let ps = pieces(&lens, workers);
        for (entry, &len) in lens.iter().enumerate() {
            let mine: Vec<&Piece> = ps.iter().filter(|p| p.entry == entry).collect();
            assert_eq!(mine.first().unwrap().range.start, 0);
            assert_eq!(mine.last().unwrap().range.end, len);
            for w in mine.windows(2) {
                assert_eq!(w[0].range.end, w[1].range.start);
                assert_eq!(w[0].range.end % 4096, 0);
            }
            let expect = if len >= RANGE_BYTES {
                workers.min(len / (RANGE_BYTES / 2))
            } else {
                1
            };
            assert_eq!(mine.len(), expect, "entry {entry} workers {workers}");
        }
    }
}

/// The combined CRCs equal the plain CRC-32 of each slice, for any number of threads.
#[test]
fn combined_ranges_give_the_plain_crc() {
    let big = bytes(2 * RANGE_BYTES + 4097, 1);
    let small = bytes(1000, 2);
    let empty: Vec<u8> = Vec::new();
    let datas: Vec<&[u8]> = vec![&big, &small, &empty, &big[5..RANGE_BYTES + 77]];
    let want: Vec<u32> = datas.iter().map(|d| crc32(d)).collect();
    for threads in [1, 2, 3, 0] {
        assert_eq!(crc32_all(&datas, threads).unwrap(), want, "threads {threads}");
    }
    assert_eq!(crc32_all(&[], 2).unwrap(), Vec::<u32>::new());
}
