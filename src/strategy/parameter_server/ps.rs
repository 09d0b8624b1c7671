//! A ps task: holds its shards (trainable values, then state values, as `layout.rs` lays
//! them out) with the optimizer state of its trainable values, and applies every pushed
//! gradient as it arrives, TensorFlow's asynchronous default. One thread per connection (the
//! chief and each worker); an update holds the lock for one optimizer pass, so a pull never
//! sees half an update. The version counts the updates applied: a push says which version
//! its gradient was computed on, and the difference is the staleness the chief reports.

use super::layout::Piece;
use super::shared::Shared;
use super::wire::{Conn, Frame, Secure, Tag, text_of};
use crate::cluster::{Role, TaskId};
use crate::collective::RingTls;
use crate::engine::Optimizer;
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// What one ps task serves.
pub struct PsTask {
    /// Its pieces of the model.
    pub pieces: Vec<Piece>,
    /// The optimizer over its trainable values (no clipping: workers clip the whole
    /// gradient by its global norm before pushing it, as only they see all of it).
    pub optimizer: Optimizer,
    /// Its bound data-plane listener.
    pub listener: TcpListener,
    /// The job token's hash.
    pub token: u64,
    /// This task.
    pub task: TaskId,
    /// How long a worker on this host may take to join a shared-memory segment it offered
    /// (and a peer to finish its TLS handshake).
    pub timeout: Duration,
    /// Mutual TLS on every connection (`cluster.tls`).
    pub tls: Option<RingTls>,
}

/// Who answers a connection, for the segments its peer may offer.
#[derive(Clone, Copy)]
struct Me {
    task: TaskId,
    token: u64,
    timeout: Duration,
}

struct Held {
    values: Vec<f32>,
    trainable: usize,
    optimizer: Optimizer,
    version: u64,
    /// Workers connected through shared memory now (the others pull and push over TCP).
    shared_workers: u64,
}

/// Serves pulls, pushes and sets until the chief says stop.
pub fn serve(task: PsTask) -> std::io::Result<()> {
    let trainable = task.pieces.iter().filter(|p| !p.state).map(|p| p.range.len()).sum();
    let len = task.pieces.iter().map(|p| p.range.len()).sum();
    let held = Arc::new(Mutex::new(Held {
        values: vec![0.0; len],
        trainable,
        optimizer: task.optimizer,
        version: 0,
        shared_workers: 0,
    }));
    let done = Arc::new(AtomicBool::new(false));
    // Polled so that the chief's stop ends the accept loop without another connection.
    task.listener.set_nonblocking(true)?;
    let mut threads = Vec::new();
    while !done.load(Ordering::SeqCst) {
        match task.listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                let (held, done) = (Arc::clone(&held), Arc::clone(&done));
                let me = Me { task: task.task, token: task.token, timeout: task.timeout };
                let tls = task.tls.clone();
                threads.push(std::thread::spawn(move || {
                    let secure = tls.as_ref().map(|tls| Secure { tls, within: me.timeout, peer: None });
                    // A stranger refused, or a peer gone: only that connection ends.
                    if let Ok(conn) = Conn::accept(stream, me.token, None, secure) {
                        let _ = answer(conn, &held, &done, me);
                    }
                }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Answers one peer's requests in order. A push's gradient is read into a buffer kept for
/// the connection, and a pull's answer is copied out under the lock into another, so no
/// request allocates, and the lock is never held while a slow peer reads. A worker on this
/// host shares a segment instead (`shared.rs`): pulls are copied into it under the lock and
/// pushes applied from it, and neither carries floats over the socket.
fn answer(conn: Conn, held: &Mutex<Held>, done: &AtomicBool, me: Me) -> std::io::Result<()> {
    let mut shared = None;
    let r = requests(conn, held, done, me, &mut shared);
    if shared.is_some() {
        held.lock().unwrap_or_else(PoisonError::into_inner).shared_workers -= 1;
    }
    r
}

fn requests(
    mut conn: Conn,
    held: &Mutex<Held>,
    done: &AtomicBool,
    me: Me,
    shared: &mut Option<Shared>,
) -> std::io::Result<()> {
    let (mut floats, mut out) = (Vec::new(), Vec::new());
    loop {
        let (tag, ints) = conn.read_into(&mut floats)?;
        if tag == Tag::Share {
            let len = held.lock().unwrap_or_else(PoisonError::into_inner).values.len();
            let reply = match share(&ints, &floats, len, me) {
                Ok(s) => {
                    if shared.replace(s).is_none() {
                        held.lock().unwrap_or_else(PoisonError::into_inner).shared_workers += 1;
                    }
                    Frame::new(Tag::Ok, Vec::new(), Vec::new())
                }
                Err(why) => Frame::error(&why),
            };
            conn.write(&reply)?;
            continue;
        }
        let mut h = held.lock().unwrap_or_else(PoisonError::into_inner);
        let reply = match tag {
            Tag::Pull => {
                let slots = ints.first() == Some(&1);
                if let Some(sh) = shared.as_mut().filter(|_| !slots) {
                    sh.pull_mut()[..h.values.len()].copy_from_slice(&h.values);
                    let counts = [h.version, h.optimizer.iterations(), h.shared_workers];
                    drop(h);
                    sh.publish();
                    conn.send(Tag::Ok, &counts, &[])?;
                    continue;
                }
                let counts = pull(&h, slots, &mut out);
                drop(h);
                conn.send(Tag::Ok, &counts, &[&out])?;
                continue;
            }
            Tag::Push => match shared.as_ref().filter(|_| floats.is_empty()) {
                Some(sh) => push(&mut h, &ints, sh.pushed()),
                None => push(&mut h, &ints, &floats),
            },
            Tag::Set => set(&mut h, &ints, &floats),
            Tag::Stop => {
                done.store(true, Ordering::SeqCst);
                Frame::new(Tag::Ok, Vec::new(), Vec::new())
            }
            Tag::Hello | Tag::Ok | Tag::Error | Tag::Run | Tag::Share => {
                Frame::error("a ps answers pull, push, set, stop and share")
            }
        };
        drop(h);
        conn.write(&reply)?;
    }
}

/// Creates the segment a worker on this host offered: `ints = [floats per area, worker
/// index]`, the floats its path. Each area must hold a push: the learning rate and `len`
/// values.
fn share(ints: &[u64], floats: &[f32], len: usize, me: Me) -> Result<Shared, String> {
    let &[per_area, index] = ints else {
        return Err("a share names the floats per area and the worker".into());
    };
    if per_area != len as u64 + 1 {
        return Err(format!("a share of {per_area} floats per area to a ps holding {len} values"));
    }
    let worker = TaskId { role: Role::Worker, index: u32::try_from(index).unwrap_or(u32::MAX) };
    Shared::accept(Path::new(&text_of(floats)), len + 1, (me.task, worker), me.token, me.timeout)
}

/// Copies the values (and, with `slots`, the optimizer's state buffers) into `out`; returns
/// the version, the update count and the workers connected through shared memory.
fn pull(h: &Held, slots: bool, out: &mut Vec<f32>) -> [u64; 3] {
    out.clear();
    out.extend_from_slice(&h.values);
    if slots {
        for (_, buffer) in h.optimizer.state() {
            out.extend_from_slice(buffer);
        }
    }
    [h.version, h.optimizer.iterations(), h.shared_workers]
}

/// Applies one gradient: `ints = [version pulled]`, `floats = [lr, gradient of the trainable
/// values, state values]`.
fn push(h: &mut Held, ints: &[u64], floats: &[f32]) -> Frame {
    let (Some(&pulled), Some((&lr, rest))) = (ints.first(), floats.split_first()) else {
        return Frame::error("a push carries the version pulled and a learning rate");
    };
    if rest.len() != h.values.len() {
        return Frame::error(&format!("a push of {} values to a ps holding {}", rest.len(), h.values.len()));
    }
    let (grads, state) = rest.split_at(h.trainable);
    let Held { values, trainable, optimizer, version, .. } = h;
    let (params, held_state) = values.split_at_mut(*trainable);
    optimizer.step(params, grads, lr);
    // Statistics (moving means) are assigned: the last worker's value stands.
    held_state.copy_from_slice(state);
    let staleness = version.saturating_sub(pulled);
    *version += 1;
    Frame::new(Tag::Ok, vec![staleness], Vec::new())
}

/// Replaces everything: `ints = [update count]`, `floats = [values, slots…]`.
fn set(h: &mut Held, ints: &[u64], floats: &[f32]) -> Frame {
    let len = h.values.len();
    let slots = h.optimizer.state().len();
    if floats.len() != len + slots * h.trainable {
        return Frame::error(&format!("a set of {} values to a ps holding {len} and {slots} slots", floats.len()));
    }
    h.values.copy_from_slice(&floats[..len]);
    let mut at = len;
    for (_, buffer) in h.optimizer.state_mut() {
        let n = buffer.len();
        buffer.copy_from_slice(&floats[at..at + n]);
        at += n;
    }
    h.optimizer.set_iterations(ints.first().copied().unwrap_or(0));
    Frame::new(Tag::Ok, Vec::new(), Vec::new())
}
