//! Reservation notifications (NVMe Base 2.0, 8.19.6): what a controller
//! logs when another host's reservation command affects its host, and the
//! log it keeps of them (Log Page 80h). The controller holds the log; the
//! reservation commands (`reservation`) post to it.

/// A reservation notification (Reservation Notification log page type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Notice {
    RegistrationPreempted = 1,
    ReservationReleased = 2,
    ReservationPreempted = 3,
}

impl Notice {
    /// The bit of the Reservation Notification Mask feature that masks it.
    pub fn mask_bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// AER completion dword 0 for "Reservation Log Page Available": I/O
/// command set specific status (type 6h), information 00h, log page 80h.
pub const AEN_RESERVATION_LOG: u32 = 0x0080_0006;

/// Entries a controller keeps in its Reservation Notification log before the
/// oldest are lost (the Log Page Count still counts them).
pub const NOTICE_LOG_ENTRIES: usize = 255;

/// Size of one Reservation Notification log page.
pub const NOTICE_LOG_PAGE: usize = 64;

/// A controller's Reservation Notification log and mask.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NoticeLog {
    /// Log Page Count of the last entry made (never 0 once one was made).
    count: u64,
    entries: std::collections::VecDeque<(u64, Notice, u32)>,
    /// The Reservation Notification Mask feature (bits 1-3); one mask for
    /// every namespace of the controller.
    pub mask: u32,
    /// The log page event was raised and the host has not read the log yet.
    event_out: bool,
}

impl NoticeLog {
    /// Logs `notice` on `nsid` unless masked; true when the log page event
    /// should be raised.
    pub fn post(&mut self, nsid: u32, notice: Notice) -> bool {
        if self.mask & notice.mask_bit() != 0 {
            return false;
        }
        // The count wraps from FFFFFFFFFFFFFFFFh to 1 (0 means "empty").
        self.count = self.count.checked_add(1).unwrap_or(1);
        if self.entries.len() == NOTICE_LOG_ENTRIES {
            self.entries.pop_front();
        }
        self.entries.push_back((self.count, notice, nsid));
        !std::mem::replace(&mut self.event_out, true)
    }

    /// Get Log Page 80h: the oldest entry (an empty page when there is
    /// none), consumed; `rae`: Retain Asynchronous Event (the event stays
    /// out).
    pub fn read(&mut self, rae: bool) -> Vec<u8> {
        let mut page = vec![0u8; NOTICE_LOG_PAGE];
        if let Some((count, notice, nsid)) = self.entries.pop_front() {
            page[0..8].copy_from_slice(&count.to_le_bytes());
            page[8] = notice as u8;
            page[9] = u8::try_from(self.entries.len()).unwrap_or(u8::MAX);
            page[12..16].copy_from_slice(&nsid.to_le_bytes());
        }
        if !rae {
            self.event_out = false;
        }
        page
    }
}
