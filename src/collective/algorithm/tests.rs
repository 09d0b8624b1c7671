//! Subgroups: an algorithm runs a step among some ranks only, in their own numbering, while
//! the other ranks run theirs, over the same transport.

use super::*;
use crate::collective::CollectiveTimeouts;
use crate::collective::error::ALL_REDUCE;
use crate::collective::transport::shared_memory::{SharedMemory, ShmOptions};
use std::thread;
use std::time::Duration;

#[test]
fn subgroups_number_their_ranks_and_keep_to_them() {
    let g = Group { members: vec![0, 1, 2, 3, 4], me: 3 };
    let odd = g.subgroup(&[1, 3]).unwrap();
    assert_eq!((odd.rank(), odd.size(), odd.global(0), odd.global(1)), (1, 2, 1, 3));
    assert!(g.subgroup(&[0, 2, 4]).is_none(), "rank 3 is not among them");
    let leaders = odd.subgroup(&[1]).unwrap();
    assert_eq!((leaders.rank(), leaders.size(), leaders.global(0)), (0, 1, 3));
}

#[test]
fn the_ring_runs_on_two_subgroups_at_once_over_shared_memory() {
    let world = 4;
    let path = format!("/dev/shm/trainrun-unit-subgroups-{}", std::process::id());
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let path = path.clone();
            thread::spawn(move || -> Result<Vec<f32>, CollectiveError> {
                let names = (0..world).map(|r| format!("worker:{r}")).collect();
                let peers = Peers::new(rank, names)?;
                let timeouts = CollectiveTimeouts { connect: Duration::from_secs(20), op: Duration::from_secs(20) };
                // A small outbox, so 1000 floats go in many pipelined segments.
                let opts = ShmOptions { staging_bytes: 1024, ..ShmOptions::new(path) };
                let mut shm = SharedMemory::join(peers, &opts, timeouts)?;
                let all = Group::all(shm.peers());
                // Even ranks sum among themselves, odd ranks among themselves.
                let mine = all.subgroup(if rank % 2 == 0 { &[0, 2] } else { &[3, 1] }).unwrap_or(all.clone());
                let mut data: Vec<f32> = (0..1000).map(|i| (i * (rank + 1)) as f32).collect();
                let desc = OpDesc { kind: ALL_REDUCE, len: 1000, aux: 0 };
                let mut x = Exchanges { transport: &mut shm, group: &all, desc, seq: 1, route: HostRoute::ByHost };
                ring::Ring.all_reduce(&mut x.among(&mine), bytemuck::cast_slice_mut(&mut data), Combine::SumF32)?;
                Ok(data)
            })
        })
        .collect();
    let got: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{e}"))).collect();
    for (rank, data) in got.iter().enumerate() {
        // Ranks r and r+2 (mod 4) summed: multipliers (r+1) + (r+3).
        let m = (rank % 2 + 1 + rank % 2 + 3) as f32;
        assert!(data.iter().enumerate().all(|(i, x)| *x == i as f32 * m), "worker:{rank}");
    }
    assert!(!std::path::Path::new(&path).exists(), "the segment file was left behind");
}
