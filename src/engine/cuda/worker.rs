//! A thread per GPU. CUDA contexts, cuBLAS handles and NCCL communicators stay on the thread
//! that made them; the strategy sends each device closures to run and waits for the answers,
//! so several GPUs work at once and the strategy itself stays `Send`.

use super::error::CudaError;
use super::replica::GpuReplica;
use std::sync::mpsc;
use std::thread::JoinHandle;

type GpuTask = Box<dyn FnOnce(&mut GpuReplica) + Send>;

/// The thread that owns one GPU's replica.
pub struct GpuThread {
    index: usize,
    jobs: Option<mpsc::Sender<GpuTask>>,
    thread: Option<JoinHandle<()>>,
}

/// An answer still being computed on a device thread.
pub struct Pending<R> {
    index: usize,
    rx: mpsc::Receiver<Result<R, CudaError>>,
}

impl<R> Pending<R> {
    /// Waits for the answer.
    pub fn wait(self) -> Result<R, CudaError> {
        self.rx.recv().map_err(|_| CudaError::ThreadGone(self.index))?
    }
}

impl GpuThread {
    /// Starts the thread for `gpu:index`, building its replica with `init` there; the
    /// returned [`Pending`] says whether that worked.
    pub fn spawn(
        index: usize,
        init: impl FnOnce() -> Result<GpuReplica, CudaError> + Send + 'static,
    ) -> Result<(Self, Pending<()>), CudaError> {
        let (jobs, queue) = mpsc::channel::<GpuTask>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("trainrun-gpu{index}"))
            .spawn(move || {
                let mut replica = match init() {
                    Ok(r) => {
                        let _ = ready_tx.send(Ok(()));
                        r
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for job in queue {
                    job(&mut replica);
                }
            })
            .map_err(|e| CudaError::Unsupported(format!("cannot start the thread for gpu:{index}: {e}")))?;
        Ok((Self { index, jobs: Some(jobs), thread: Some(thread) }, Pending { index, rx: ready_rx }))
    }

    /// Runs `f` on the device's thread.
    pub fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut GpuReplica) -> Result<R, CudaError> + Send + 'static,
    ) -> Result<Pending<R>, CudaError> {
        let (tx, rx) = mpsc::channel();
        let job: GpuTask = Box::new(move |r| {
            let _ = tx.send(f(r));
        });
        self.jobs
            .as_ref()
            .ok_or(CudaError::ThreadGone(self.index))?
            .send(job)
            .map_err(|_| CudaError::ThreadGone(self.index))?;
        Ok(Pending { index: self.index, rx })
    }
}

impl Drop for GpuThread {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop; the replica is freed on its own thread.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
