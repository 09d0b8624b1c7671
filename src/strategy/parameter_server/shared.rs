//! The same-host data plane between a worker and a ps: when the two ends of their TCP
//! connection share an address, pulls and pushes move through a shared-memory segment (the
//! one the collective's shared-memory ring uses, `collective::segment`, of two ranks: the
//! ps is rank 0, the worker rank 1) instead of through the socket. Each rank's staging area
//! is one buffer: the ps's holds the values a pull answers, the worker's the learning rate
//! and the gradient a push carries.
//!
//! Requests and answers stay on the TCP connection, only without their floats, so nothing
//! else changes: the ps writes its area only while it answers this worker's pull, and reads
//! the worker's only while it applies this worker's push; the worker reads the ps's area
//! after the pull's answer arrived and writes its own before it sends the next push. The
//! socket orders the two processes' accesses (a `write` that sends a frame happens before the
//! `read` that returns it), and a dead or silent peer is still a broken or silent connection,
//! named with the same errors and timeouts as over TCP. A push lost with a worker killed
//! mid-copy is never applied: its frame was never sent.
//!
//! What it saves per step and worker (tutorial model, 11 MB per pull or push): four kernel
//! copies through the socket and the wake-ups of streaming 11 MB through its buffers; what is
//! left is the ps's copy out under its lock and the worker's copies in and out of the segment.

use super::wire::{Conn, Frame, Tag};
use crate::cluster::TaskId;
use crate::cluster::job::segment_dir;
use crate::collective::Peers;
use crate::collective::segment::Segment;
use std::path::Path;
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

/// The ps's rank in the segment; the worker is rank 1.
const PS: usize = 0;
const WORKER: usize = 1;

/// One worker's and one ps's shared buffers; each end holds its own mapping.
pub struct Shared {
    seg: Segment,
    floats: usize,
}

impl Shared {
    /// The worker's end: when the connection to `ps` joins two tasks of one host, offers a
    /// segment of `floats` per area and joins it as the ps creates it, within `within`.
    /// `Ok(None)`: the two are on different hosts; `Err`: why the segment could not be set up.
    pub fn offer(
        conn: &mut Conn,
        (worker, ps): (TaskId, TaskId),
        floats: usize,
        token: u64,
        within: Duration,
    ) -> Result<Option<Self>, String> {
        if !conn.same_host() {
            return Ok(None);
        }
        let name = format!("trainrun-ps-{token:016x}-{}-{}-{}", ps.index, worker.index, std::process::id());
        let path = segment_dir().join(name);
        let text = path.to_string_lossy().into_owned();
        conn.write(&Frame::with_text(Tag::Share, vec![floats as u64, u64::from(worker.index)], &text))
            .map_err(|e| format!("offering {ps} shared memory failed ({e})"))?;
        // The ps creates the segment as it reads the offer, and answers once both joined.
        let joined = join(WORKER, (ps, worker), &path, floats, token, within);
        let answer = conn.read();
        match (joined, answer) {
            (Ok(shared), Ok(a)) if a.tag == Tag::Ok => Ok(Some(shared)),
            (Ok(_), Ok(a)) => Err(format!("{ps} declined shared memory ({})", a.text())),
            (Err(e), _) => Err(format!("shared memory with {ps} failed ({e})")),
            (_, Err(e)) => Err(format!("{ps} did not answer its offer ({e})")),
        }
    }

    /// The ps's end of an offer of `floats` per area at `path`.
    pub fn accept(
        path: &Path,
        floats: usize,
        (ps, worker): (TaskId, TaskId),
        token: u64,
        within: Duration,
    ) -> Result<Self, String> {
        join(PS, (ps, worker), path, floats, token, within).map_err(|e| e.to_string())
    }

    /// The values of the ps's last answered pull (the worker reads them).
    pub fn pulled(&self) -> &[f32] {
        fence(Ordering::SeqCst);
        // SAFETY: the area lies inside the mapping, which lives as long as self; the ps
        // writes it only while answering a pull, and the caller reads after the answer came
        // (module docs).
        unsafe { std::slice::from_raw_parts(self.seg.staging_ptr(PS), self.floats) }
    }

    /// The ps's area, to write a pull's answer into.
    pub fn pull_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `pulled`; the worker does not read it while its pull is unanswered.
        unsafe { std::slice::from_raw_parts_mut(self.seg.staging_ptr(PS), self.floats) }
    }

    /// The worker's area, to write a push into before sending its request.
    pub fn push_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `pulled`; the ps reads it only while applying a push of this worker,
        // and the worker writes it only when no push is in flight.
        unsafe { std::slice::from_raw_parts_mut(self.seg.staging_ptr(WORKER), self.floats) }
    }

    /// The push the worker wrote (the ps reads it after the request came).
    pub fn pushed(&self) -> &[f32] {
        fence(Ordering::SeqCst);
        // SAFETY: as in `push_mut`.
        unsafe { std::slice::from_raw_parts(self.seg.staging_ptr(WORKER), self.floats) }
    }

    /// Orders this side's writes to the segment before the request or answer that follows.
    pub fn publish(&self) {
        fence(Ordering::SeqCst);
    }
}

fn join(
    rank: usize,
    (ps, worker): (TaskId, TaskId),
    path: &Path,
    floats: usize,
    token: u64,
    within: Duration,
) -> Result<Shared, crate::collective::CollectiveError> {
    let peers = Peers::new(rank, vec![ps.to_string(), worker.to_string()])?;
    let seg = Segment::join(&peers, path, floats, 0, token, within)?;
    Ok(Shared { seg, floats })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Role;
    use std::net::TcpListener;

    #[test]
    fn a_worker_and_a_ps_on_one_host_meet_in_a_segment_and_see_each_others_writes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (ps, worker) = (TaskId::new(Role::Ps, 0), TaskId::new(Role::Worker, 3));
        let token = 0x5eed;
        let within = Duration::from_secs(10);
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut conn = Conn::accept(stream, token, Some(within), None).unwrap();
            let offer = conn.read().unwrap();
            assert_eq!((offer.tag, offer.ints.as_slice()), (Tag::Share, &[5u64, 3][..]));
            let mut shared = Shared::accept(Path::new(&offer.text()), 5, (ps, worker), token, within).unwrap();
            conn.write(&Frame::new(Tag::Ok, Vec::new(), Vec::new())).unwrap();
            // A push arrives, then a pull is answered from the ps's area.
            assert_eq!(conn.read().unwrap().tag, Tag::Push);
            let pushed = shared.pushed().to_vec();
            shared.pull_mut().copy_from_slice(&[9.0, 8.0, 7.0, 6.0, 5.0]);
            shared.publish();
            conn.write(&Frame::new(Tag::Ok, Vec::new(), Vec::new())).unwrap();
            pushed
        });
        let mut conn = Conn::dial(addr, token, within, within, None).unwrap();
        assert!(conn.same_host());
        let mut shared = Shared::offer(&mut conn, (worker, ps), 5, token, within)
            .expect("shared memory on loopback")
            .expect("one host");
        shared.push_mut().copy_from_slice(&[0.5, 1.0, -2.0, 3.5, f32::MAX]);
        shared.publish();
        conn.write(&Frame::new(Tag::Push, Vec::new(), Vec::new())).unwrap();
        assert_eq!(conn.read().unwrap().tag, Tag::Ok);
        assert_eq!(shared.pulled(), [9.0, 8.0, 7.0, 6.0, 5.0]);
        assert_eq!(server.join().unwrap(), [0.5, 1.0, -2.0, 3.5, f32::MAX]);
    }
}
