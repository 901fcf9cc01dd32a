//! Headless Chromium driven like a user, for the dashboard's forms: the
//! DevTools protocol over `--remote-debugging-pipe` (JSON messages ending
//! in a NUL byte; the browser reads fd 3 and writes fd 4), std only. The
//! test's script clicks a page's buttons and fills its fields as a person
//! would; the pages themselves run no JavaScript.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A running headless Chromium with one page.
pub struct Browser {
    child: Child,
    to_browser: File,
    from_browser: mpsc::Receiver<Value>,
    next_id: u64,
    session: String,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // Close-on-exec: the browser gets only the two `dup2` makes (which
    // clears the flag on the copies).
    // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe: {}", std::io::Error::last_os_error());
    // SAFETY: both were just opened and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Starts `browser` with a fresh profile in `profile`, on a blank page.
    pub fn launch(browser: &Path, profile: &Path) -> Self {
        let (browser_reads, we_write) = pipe();
        let (we_read, browser_writes) = pipe();
        let (read_fd, write_fd) = (browser_reads.as_raw_fd(), browser_writes.as_raw_fd());
        let mut command = Command::new(browser);
        command
            .args(crate::dashboard::HEADLESS)
            .arg("--remote-debugging-pipe")
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (dup2) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(read_fd, 3) < 0 || libc::dup2(write_fd, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("start chromium");
        drop((browser_reads, browser_writes));
        let (sender, from_browser) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(File::from(we_read));
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                message.pop();
                if let Ok(value) = serde_json::from_slice::<Value>(&message)
                    && sender.send(value).is_err()
                {
                    return;
                }
                message.clear();
            }
        });
        let mut browser = Self {
            child,
            to_browser: File::from(we_write),
            from_browser,
            next_id: 0,
            session: String::new(),
        };
        let targets = browser.call("Target.getTargets", json!({}));
        let page = targets["targetInfos"]
            .as_array()
            .and_then(|all| all.iter().find(|t| t["type"] == "page"))
            .unwrap_or_else(|| panic!("no page target in {targets}"))["targetId"]
            .clone();
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": page, "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().expect("session").to_owned();
        browser
    }

    /// Sends a command (to the page once attached); its `result`, or
    /// `Err` with the protocol's error.
    fn send(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("json");
        bytes.push(0);
        self.to_browser
            .write_all(&bytes)
            .expect("write to chromium");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .from_browser
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer from chromium to {method}"));
            if answer["id"] == id {
                return match answer.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(answer["result"].clone()),
                };
            }
        }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params)
            .unwrap_or_else(|error| panic!("{method}: {error}"))
    }

    /// Evaluates `expression` in the page; its value, or `None` while the
    /// page is between documents.
    fn try_eval(&mut self, expression: &str) -> Option<Value> {
        let result = self
            .send(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .ok()?;
        if result.get("exceptionDetails").is_some() {
            return None;
        }
        Some(result["result"]["value"].clone())
    }

    /// Evaluates `expression` in the page; its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        self.try_eval(expression)
            .unwrap_or_else(|| panic!("evaluating {expression} failed"))
    }

    /// Marks the current document, runs `act`, and waits until another
    /// document has loaded completely (a navigation or a form's answer).
    pub fn navigating(&mut self, act: impl FnOnce(&mut Self)) {
        self.eval("window.__rfidlOld = true");
        act(self);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done = self.try_eval(
                "!window.__rfidlOld && document.readyState === 'complete' && location.href",
            );
            if done.as_ref().is_some_and(Value::is_string) {
                return;
            }
            assert!(Instant::now() < deadline, "no new page loaded");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Opens `url` and waits for it.
    pub fn goto(&mut self, url: &str) {
        self.navigating(|browser| {
            browser.call("Page.navigate", json!({"url": url}));
        });
    }

    /// Clicks the first element `selector` matches.
    pub fn click(&mut self, selector: &str) {
        let found = self.eval(&format!(
            "(() => {{ const e = document.querySelector({}); if (!e) return false; e.click(); \
             return true; }})()",
            json!(selector)
        ));
        assert_eq!(found, json!(true), "nothing matches {selector}");
    }

    /// The page's HTML now.
    pub fn html(&mut self) -> String {
        self.eval("document.documentElement.outerHTML")
            .as_str()
            .expect("html")
            .to_owned()
    }

    /// The page's address now.
    pub fn location(&mut self) -> String {
        self.eval("location.href")
            .as_str()
            .expect("href")
            .to_owned()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A browser command: sent outside the page's session.
        self.session.clear();
        let _ = self.send("Browser.close", json!({}));
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
