//! The terminal while `kvtarget top` runs: the alternate screen, no cursor,
//! keys read one at a time without echo (and Ctrl-C as a key, so that the
//! view always puts the terminal back); all restored on drop. ANSI escape
//! sequences, which every terminal emulator and tmux understand.

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::termios::{self, LocalModes, OptionalActions, SpecialCodeIndex, Termios};
use std::io::Write;
use std::time::Duration;

/// A key the view acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Quit,
    Other,
}

/// Holds the terminal in the view's modes until dropped.
pub struct Screen {
    saved: Termios,
}

impl Screen {
    /// Takes over the terminal on stdin/stdout.
    pub fn enter() -> std::io::Result<Screen> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut t = saved.clone();
        // Keys arrive one at a time, unechoed; Ctrl-C is a key like q.
        t.local_modes
            .remove(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG);
        t.special_codes[SpecialCodeIndex::VMIN] = 1;
        t.special_codes[SpecialCodeIndex::VTIME] = 0;
        termios::tcsetattr(&stdin, OptionalActions::Now, &t)?;
        let screen = Screen { saved };
        // Alternate screen, cursor hidden.
        let mut out = std::io::stdout().lock();
        out.write_all(b"\x1b[?1049h\x1b[?25l")?;
        out.flush()?;
        Ok(screen)
    }

    /// The terminal's size in (columns, rows), if it says.
    pub fn size(&self) -> Option<(usize, usize)> {
        let ws = termios::tcgetwinsize(std::io::stdout()).ok()?;
        (ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col as usize, ws.ws_row as usize))
    }

    /// Draws `lines` over the previous frame, in place, clipped to the
    /// terminal.
    pub fn draw(&self, lines: &[String]) -> std::io::Result<()> {
        let (cols, rows) = self.size().unwrap_or((80, 24));
        let mut frame = String::from("\x1b[H");
        for l in lines.iter().take(rows) {
            frame.extend(l.chars().take(cols));
            // Clear what the previous frame left on this line.
            frame.push_str("\x1b[K\r\n");
        }
        // Clear below, and take back the last newline so a full screen does
        // not scroll.
        frame.truncate(frame.len() - 2);
        frame.push_str("\x1b[J");
        let mut out = std::io::stdout().lock();
        out.write_all(frame.as_bytes())?;
        out.flush()
    }

    /// Waits up to `timeout` for a key.
    pub fn key(&self, timeout: Duration) -> std::io::Result<Option<Key>> {
        let stdin = std::io::stdin();
        let mut fds = [PollFd::new(&stdin, PollFlags::IN)];
        let ts = Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        match poll(&mut fds, Some(&ts)) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let mut b = [0u8; 1];
        match rustix::io::read(&stdin, &mut b) {
            // End of input: nobody can press q any more.
            Ok(0) => Ok(Some(Key::Quit)),
            // q, Q, Esc, Ctrl-C, Ctrl-D.
            Ok(_) if matches!(b[0], b'q' | b'Q' | 0x1b | 0x03 | 0x04) => Ok(Some(Key::Quit)),
            Ok(_) => Ok(Some(Key::Other)),
            Err(rustix::io::Errno::INTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = out.flush();
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.saved);
    }
}
