//! The helpers' own PostgreSQL session, apart from the runtime's pool.

/// A job for the helpers' session.
type Job = Box<dyn FnOnce(&mut postgres::Client) + Send>;

/// The helpers' PostgreSQL session: one connection for the whole test, on
/// a thread of its own (the sync client cannot run on a tokio runtime's
/// thread). A connection per look would cost a backend start each, and
/// the polling loops look every few milliseconds.
pub struct Session {
    jobs: std::sync::mpsc::Sender<Job>,
}

impl Session {
    pub fn open(url: &str) -> Self {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (ready, started) = std::sync::mpsc::channel();
        let url = url.to_owned();
        std::thread::Builder::new()
            .name("test-store-session".into())
            .spawn(move || {
                let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
                ready.send(()).expect("ready");
                // Ends when the store (the sender) is dropped.
                while let Ok(job) = queue.recv() {
                    job(&mut client);
                }
            })
            .expect("session thread");
        started.recv().expect("the session started");
        Self { jobs }
    }

    /// Runs `work` on the session and returns its value (or its panic).
    pub fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
    ) -> T {
        let (done, result) = std::sync::mpsc::channel();
        self.jobs
            .send(Box::new(move |client| {
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(client)));
                let _ = done.send(outcome);
            }))
            .expect("the session thread is running");
        match result.recv().expect("the session answered") {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
