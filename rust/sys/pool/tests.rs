use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;
use crate::error::Error;
use crate::sys::progress::{advance, counted, counting};

#[test]
fn keeps_job_order() {
    let jobs: Vec<usize> = (0..5000).collect();
    let out = run(&jobs, 4, |&j| j % 7, |&j| Ok(j * 2)).unwrap();
    assert_eq!(out, jobs.iter().map(|j| j * 2).collect::<Vec<_>>());
}

#[test]
fn returns_an_error() {
    let jobs: Vec<usize> = (0..100).collect();
    let err = run(
        &jobs,
        3,
        |_| 1,
        |&j| {
            if j == 50 {
                Err(Error::tree("x", "boom"))
            } else {
                Ok(j)
            }
        },
    );
    assert!(err.unwrap_err().to_string().contains("boom"));
}

#[test]
fn counted_runs_credit_every_job_once() {
    let counter = Arc::new(AtomicU64::new(0));
    let jobs: Vec<usize> = (1..=300).collect();
    for workers in [1, 4] {
        counter.store(0, Ordering::Relaxed);
        // Half the jobs count some of their bytes themselves (as counted writes do).
        let out = counting(Some(counter.clone()), || {
            run(
                &jobs,
                workers,
                |&j| j,
                |&j| {
                    if j % 2 == 0 {
                        advance(j as u64 / 2);
                    }
                    Ok(j)
                },
            )
        })
        .unwrap();
        assert_eq!(out, jobs);
        assert_eq!(counter.load(Ordering::Relaxed), jobs.iter().sum::<usize>() as u64);
    }
    assert!(!counted(), "the counter is taken off the thread afterwards");
    run(&jobs, 4, |&j| j, |&j| Ok(j)).unwrap();
    assert_eq!(counter.load(Ordering::Relaxed), jobs.iter().sum::<usize>() as u64);
}

#[test]
fn counts_workers() {
    assert_eq!(worker_count(3, 10), 3);
    assert_eq!(worker_count(5, 2), 2);
    assert!(worker_count(0, 100) >= 1);
    assert_eq!(worker_count(0, 0), 1);
}
