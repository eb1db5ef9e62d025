//! Streams, events and CUDA graphs (stream capture → instantiate → launch).

use super::ctx::Ctx;
use super::ffi::{self, cu, CUevent, CUgraph, CUgraphExec, CUstream};
use crate::error::{Error, Result};
use std::sync::Arc;

/// A non-blocking stream; `Drop` destroys it (after its queued work, per the driver).
pub struct Stream {
    ctx: Arc<Ctx>,
    raw: CUstream,
}

// SAFETY: a stream handle may be used from any thread of its context's process.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new(ctx: &Arc<Ctx>) -> Result<Stream> {
        ctx.bind()?;
        let drv = ctx.drv;
        let mut raw: CUstream = std::ptr::null_mut();
        cu!(drv.cuStreamCreate(&mut raw, ffi::CU_STREAM_NON_BLOCKING))?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The driver handle, for `cuLaunchKernel` and copies.
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// Waits until everything queued on this stream has run.
    pub fn sync(&self) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuStreamSynchronize(self.raw))
    }

    /// Whether everything queued has run (no wait).
    pub fn is_idle(&self) -> Result<bool> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        // SAFETY: `raw` is a live stream of this context.
        let r = unsafe { (drv.cuStreamQuery)(self.raw) };
        if r == ffi::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        ffi::check(drv, "cuStreamQuery", r).map(|_| true)
    }

    /// Makes later work on this stream wait for `ev` (recorded on any stream).
    pub fn wait(&self, ev: &Event) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuStreamWaitEvent(self.raw, ev.raw, 0))
    }

    /// Starts capturing this stream's work into a graph (thread-local mode: other threads
    /// may keep using CUDA meanwhile). Work is recorded, not run, until `end_capture`.
    pub fn begin_capture(&self) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuStreamBeginCapture(self.raw, ffi::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    }

    /// Whether a capture is in progress on this stream.
    pub fn is_capturing(&self) -> Result<bool> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        let mut st = 0;
        cu!(drv.cuStreamIsCapturing(self.raw, &mut st))?;
        Ok(st != ffi::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Ends the capture and instantiates the recorded work as a launchable `Graph`. A capture
    /// that an illegal call invalidated fails here (`cuStreamEndCapture`).
    pub fn end_capture(&self) -> Result<Graph> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: `raw` is a live stream; the driver writes a graph handle or fails.
        let r = unsafe { (drv.cuStreamEndCapture)(self.raw, &mut graph) };
        if r != ffi::CUDA_SUCCESS {
            if !graph.is_null() {
                let _ = cu!(drv.cuGraphDestroy(graph));
            }
            return Err(Error::Cuda {
                call: "cuStreamEndCapture",
                code: r,
                msg: ffi::describe(drv, r),
            });
        }
        if graph.is_null() {
            return Err(Error::Cuda {
                call: "cuStreamEndCapture",
                code: r,
                msg: "the driver returned no graph (capture not begun on this stream?)".into(),
            });
        }
        let mut exec: CUgraphExec = std::ptr::null_mut();
        if let Err(e) = cu!(drv.cuGraphInstantiateWithFlags(&mut exec, graph, 0)) {
            let _ = cu!(drv.cuGraphDestroy(graph));
            return Err(e);
        }
        Ok(Graph {
            ctx: self.ctx.clone(),
            graph,
            exec,
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            let drv = self.ctx.drv;
            let _ = cu!(drv.cuStreamDestroy(self.raw));
        }
    }
}

/// An instantiated CUDA graph: `launch` replays the captured work on any stream. Kernel
/// arguments are baked in at capture: values that change per replay must live in device memory.
pub struct Graph {
    ctx: Arc<Ctx>,
    graph: CUgraph,
    exec: CUgraphExec,
}

// SAFETY: graph handles may be used from any thread; launches are serialised by the stream.
unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

impl Graph {
    /// Queues one replay of the graph on `s`.
    pub fn launch(&self, s: &Stream) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuGraphLaunch(self.exec, s.raw()))
    }

    /// Uploads the graph's resources to the device ahead of the first launch (optional).
    pub fn upload(&self, s: &Stream) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuGraphUpload(self.exec, s.raw()))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            let drv = self.ctx.drv;
            let _ = cu!(drv.cuGraphExecDestroy(self.exec));
            let _ = cu!(drv.cuGraphDestroy(self.graph));
        }
    }
}

/// A CUDA event: `record` on a stream, `sync`, and `start.elapsed_ms(&end)`.
pub struct Event {
    ctx: Arc<Ctx>,
    raw: CUevent,
}

// SAFETY: event handles may be used from any thread of the process.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub(crate) fn new(ctx: &Arc<Ctx>, timing: bool) -> Result<Event> {
        ctx.bind()?;
        let drv = ctx.drv;
        let flags = if timing {
            ffi::CU_EVENT_DEFAULT
        } else {
            ffi::CU_EVENT_DISABLE_TIMING
        };
        let mut raw: CUevent = std::ptr::null_mut();
        cu!(drv.cuEventCreate(&mut raw, flags))?;
        Ok(Event {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// Records the event at the current end of `s`'s queue.
    pub fn record(&self, s: &Stream) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuEventRecord(self.raw, s.raw()))
    }

    /// Waits until the recorded point has been reached.
    pub fn sync(&self) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuEventSynchronize(self.raw))
    }

    /// Whether the recorded point has been reached (no wait).
    pub fn is_done(&self) -> Result<bool> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        // SAFETY: `raw` is a live event.
        let r = unsafe { (drv.cuEventQuery)(self.raw) };
        if r == ffi::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        ffi::check(drv, "cuEventQuery", r).map(|_| true)
    }

    /// Milliseconds from this event to `end` (both recorded, both with timing, `end` reached).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        let mut ms = 0f32;
        cu!(drv.cuEventElapsedTime(&mut ms, self.raw, end.raw))?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            let drv = self.ctx.drv;
            let _ = cu!(drv.cuEventDestroy(self.raw));
        }
    }
}
