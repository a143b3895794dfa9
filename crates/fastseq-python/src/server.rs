//! The network server (`fastseq-serve`) from Python: `Server` starts it on sockets Python
//! bound, over engines that are Python callables (the pipeline's runner, entered once a batch
//! with one GIL acquisition), and drains it; `TensorData` hands a batch's bytes to numpy
//! without a copy; log lines go to Python's logging from a thread of their own, many lines a
//! GIL acquisition, so that a flood of client errors never takes the GIL from the batches.
use std::net::TcpListener;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fastseq_serve::batching::{Engine, EngineError};
use fastseq_serve::service::{Log, Options, Service};
use fastseq_serve::tensor::{Datatype, ModelSpec, Tensor};

use crate::serving::ServedSpec;
use fastseq_serve::transport;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// A tensor's bytes, read-only, as Python's buffer protocol hands them to numpy.
#[pyclass(frozen, module = "fastseq._core")]
pub struct TensorData(Bytes);

#[pymethods]
impl TensorData {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let data = &slf.get().0;
        // CPython's own filling of a one-dimensional read-only byte buffer (what `bytes` hands
        // out): it refuses a writable request, and the view holds a reference to the object,
        // whose bytes live as long as it does.
        // SAFETY: `view` is the caller's to fill; the pointer and length are the object's own.
        let done = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::os::raw::c_void,
                data.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if done == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }
}

/// A Python callable `run([(TensorData, shape), ...]) -> [(shape, buffer of bytes), ...]`
/// as the batches' engine, on the worker thread's own Python thread state ([`Interpreter`]).
/// An exception with `refused_input = True` is the caller's mistake.
struct PyEngine(Py<PyAny>, Interpreter);

impl Engine for PyEngine {
    fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, EngineError> {
        Python::attach(|py| {
            let args: Vec<Bound<'_, PyTuple>> = inputs
                .into_iter()
                .map(|t| {
                    let data = Bound::new(py, TensorData(t.data)).expect("a TensorData");
                    let shape = PyTuple::new(py, t.shape).expect("a shape");
                    PyTuple::new(py, [data.into_any(), shape.into_any()]).expect("a pair")
                })
                .collect();
            let called = self.0.bind(py).call1((PyList::new(py, args).expect("a list"),));
            let outputs = match called {
                Ok(o) => o,
                Err(e) => {
                    let refused = e.value(py).getattr("refused_input").and_then(|v| v.is_truthy()).unwrap_or(false);
                    let message = e.value(py).str().map(|s| s.to_string()).unwrap_or_else(|_| "the run failed".into());
                    return Err(EngineError { message, refused_input: refused });
                }
            };
            read_outputs(&outputs).map_err(|e| EngineError::failed(format!("the engine's answer: {e}")))
        })
    }

    fn on_worker_thread(&self, work: &mut (dyn FnMut() + Send)) {
        self.1.thread(work)
    }
}

/// The interpreter that the server's own threads enter.
#[derive(Clone, Copy)]
struct Interpreter(*mut ffi::PyInterpreterState);

// SAFETY: an interpreter belongs to the whole process; only CPython's thread-state calls,
// which may be made from any thread, are given its pointer.
unsafe impl Send for Interpreter {}
unsafe impl Sync for Interpreter {}

impl Interpreter {
    fn current(_py: Python<'_>) -> Interpreter {
        // SAFETY: the GIL is held (`_py`), as PyInterpreterState_Get requires.
        Interpreter(unsafe { ffi::PyInterpreterState_Get() })
    }

    /// Runs `work`, a thread's whole life, with one Python thread state made for the thread
    /// and ended with it, as Python makes and ends its own threads'; the thread holds no GIL
    /// meanwhile, and each `Python::attach` in `work` takes it on that state. Attached without
    /// one, each `Python::attach` would make a thread state and end it after (PyGILState):
    /// objects left in the thread's locals would be destroyed at each end, inside the call
    /// that ends it, and a gevent hub (which tritonclient's finalizers make in whatever
    /// thread collects them) crashed the interpreter so: a segmentation fault.
    fn thread(self, work: &mut (dyn FnMut() + Send)) {
        struct Ended(*mut ffi::PyThreadState);
        impl Drop for Ended {
            fn drop(&mut self) {
                // SAFETY: the state is this thread's, made below and not current; Python's
                // own threads end theirs so: cleared with the GIL held on it, then deleted.
                unsafe {
                    ffi::PyEval_RestoreThread(self.0);
                    ffi::PyThreadState_Clear(self.0);
                    ffi::PyEval_SaveThread();
                    ffi::PyThreadState_Delete(self.0);
                }
            }
        }
        // SAFETY: a new thread state of a live interpreter for this thread, which has none;
        // the GIL need not be held to make one.
        let _state = Ended(unsafe { ffi::PyThreadState_New(self.0) });
        work();
    }
}

fn read_outputs(outputs: &Bound<'_, PyAny>) -> PyResult<Vec<Tensor>> {
    let mut found = Vec::new();
    for item in outputs.try_iter()? {
        let item = item?;
        let (datatype, shape, data): (String, Vec<usize>, Bound<'_, PyAny>) = item.extract()?;
        let datatype =
            Datatype::parse(&datatype).ok_or_else(|| PyValueError::new_err(format!("datatype {datatype}")))?;
        let buffer = pyo3::buffer::PyBuffer::<u8>::get(&data)?;
        // One copy a batch, made holding the GIL, so that nothing Python's outlives the call.
        let bytes = Bytes::from(buffer.to_vec(item.py())?);
        found.push(Tensor { datatype, shape, data: bytes });
    }
    Ok(found)
}

fn options(d: &Bound<'_, PyDict>) -> PyResult<(Options, usize)> {
    let mut o = Options::default();
    let mut threads = 0;
    for (key, value) in d.iter() {
        let key: String = key.extract()?;
        let seconds = |v: &Bound<'_, PyAny>| -> PyResult<Duration> {
            let s: f64 = v.extract()?;
            Duration::try_from_secs_f64(s)
                .map_err(|_| PyValueError::new_err(format!("{key}: {s} is not a number of seconds")))
        };
        match key.as_str() {
            "max_queue" => o.max_queue = value.extract()?,
            "max_uploads" => o.max_uploads = value.extract()?,
            "max_request_bytes" => o.max_request_bytes = value.extract()?,
            "memory_budget" => o.memory_budget = value.extract()?,
            "timeout_s" => o.timeout = seconds(&value)?,
            "body_timeout_s" => o.body_timeout = seconds(&value)?,
            "header_timeout_s" => o.header_timeout = seconds(&value)?,
            "max_header_bytes" => o.max_header_bytes = value.extract()?,
            "max_headers" => o.max_headers = value.extract()?,
            "version" => o.version = value.extract()?,
            "threads" => threads = value.extract()?,
            other => return Err(PyValueError::new_err(format!("'{other}' is not a server option"))),
        }
    }
    Ok((o, threads))
}

/// Log lines to Python's logging, from a thread of their own.
fn logger(sink: Py<PyAny>, interpreter: Interpreter) -> (Log, Arc<AtomicU64>) {
    let (send, receive) = sync_channel::<(bool, String)>(4096);
    let dropped = Arc::new(AtomicU64::new(0));
    let lost = dropped.clone();
    std::thread::Builder::new()
        .name("fastseq-serve-log".into())
        .spawn(move || {
            interpreter.thread(&mut move || {
                while let Ok(first) = receive.recv() {
                    let mut lines = vec![first];
                    lines.extend(receive.try_iter().take(1024));
                    Python::attach(|py| {
                        let n = lost.swap(0, Ordering::Relaxed);
                        if n > 0 {
                            let _ = sink.call1(
                                py,
                                (true, format!("{n} log lines were dropped: more came than could be written")),
                            );
                        }
                        for (error, line) in lines {
                            let _ = sink.call1(py, (error, line));
                        }
                    });
                }
            })
        })
        .expect("a thread for the server's log");
    let counter = dropped.clone();
    let log: Log = Arc::new(move |error, line| {
        if let Err(TrySendError::Full(_)) = send.try_send((error, line.to_string())) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    (log, dropped)
}

/// A running server.
#[pyclass(frozen, module = "fastseq._core")]
pub struct Server {
    inner: Option<transport::Server>,
}

impl Drop for Server {
    /// Dropped by Python (holding the GIL), the server ends its batchers' workers and waits
    /// for them, and each needs the GIL to end its Python thread state: let go of it meanwhile.
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            Python::attach(|py| py.detach(move || drop(inner)));
        }
    }
}

impl Server {
    fn inner(&self) -> &transport::Server {
        self.inner.as_ref().expect("a server not dropped")
    }
}

#[pymethods]
impl Server {
    /// Runs a row of zeros through each model, then marks the server ready; a RuntimeError
    /// saying which model failed and why.
    fn warm_up(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner().service().warm_up()).map_err(PyRuntimeError::new_err)
    }

    /// Ready without a warm-up run.
    fn mark_ready(&self) {
        self.inner().service().mark_ready();
    }

    /// Stops taking requests; those open go on.
    fn drain(&self) {
        self.inner().drain();
    }

    /// Drains, waits up to `grace_s` for the open requests, closes. True where all ended in time.
    fn shutdown(&self, py: Python<'_>, grace_s: f64) -> bool {
        let grace = Duration::try_from_secs_f64(grace_s).unwrap_or(Duration::ZERO);
        py.detach(|| self.inner().shutdown(grace))
    }

    #[getter]
    fn ready(&self) -> bool {
        self.inner().service().ready()
    }

    /// Requests open now (arriving, queued or running).
    #[getter]
    fn open(&self) -> usize {
        self.inner().service().open()
    }
}

/// Serves `models` (pairs of a served spec and an engine callable) on the listening socket
/// `http_fd` (and `grpc_fd`), both taken over; `options` as fastseq.serving sets them;
/// `log(error, line)` receives one line per failure.
#[pyfunction]
#[pyo3(signature = (models, http_fd, grpc_fd, options, log))]
pub(crate) fn start_server(
    py: Python<'_>,
    models: Vec<(PyRef<'_, ServedSpec>, Py<PyAny>)>,
    http_fd: i32,
    grpc_fd: Option<i32>,
    options: Bound<'_, PyDict>,
    log: Py<PyAny>,
) -> PyResult<Server> {
    let (options, threads) = self::options(&options)?;
    let mut served: Vec<(ModelSpec, Arc<dyn Engine>)> = Vec::new();
    let interpreter = Interpreter::current(py);
    for (d, engine) in models {
        served.push((d.0.clone(), Arc::new(PyEngine(engine, interpreter))));
    }
    let (log, _) = logger(log, interpreter);
    // SAFETY: Python detached these descriptors for us: we own them from here.
    let http = unsafe { TcpListener::from_raw_fd(http_fd) };
    let grpc = grpc_fd.map(|fd| unsafe { TcpListener::from_raw_fd(fd) });
    py.detach(|| {
        let service = Service::new(served, options, log);
        transport::Server::start(service, http, grpc, threads)
    })
    .map(|inner| Server { inner: Some(inner) })
    .map_err(|e| PyRuntimeError::new_err(format!("cannot start the server: {e}")))
}
