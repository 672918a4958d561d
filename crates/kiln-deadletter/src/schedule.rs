//! When the daily report goes out: a local time of day in an IANA time zone (jiff, with the
//! time zone database bundled).
//!
//! A report belongs to a *report day*: the local date in the zone. Its send instant is that
//! date at the configured time, resolved like a wall clock would be ("compatible"
//! disambiguation): a time that does not exist on a spring-forward day (02:30 in a 02:00 to
//! 03:00 gap) is sent that much later (03:30), and a time that happens twice on a fall-back
//! day is sent at the first of the two. So every day has exactly one send instant, and days
//! are 23 or 25 hours apart around a change.
//!
//! A service that was down at the send instant sends the day's report when it starts, as long
//! as it is still the same local day; a day that passed entirely while it was down gets no
//! report (the next report lists its nodes: nothing is lost, only one email is skipped).

use anyhow::{anyhow, Context};
use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;
use jiff::Timestamp;

#[derive(Debug, Clone)]
pub struct Schedule {
    pub zone_name: String,
    pub tz: TimeZone,
    pub at: Time,
}

/// What the service should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The report of this day is due (its instant has passed and it is still that day).
    SendNow(Date),
    /// Nothing is due before this instant.
    WaitUntil(Timestamp),
}

impl Schedule {
    /// `time` is `HH:MM` (24-hour); `zone` an IANA name such as `Europe/Berlin` or `UTC`.
    pub fn parse(time: &str, zone: &str) -> anyhow::Result<Schedule> {
        let at = parse_hh_mm(time)
            .ok_or_else(|| anyhow!("report time {time:?} is not HH:MM (00:00 to 23:59)"))?;
        let tz = TimeZone::get(zone).with_context(|| {
            format!("report time zone {zone:?} is not an IANA time zone (e.g. Europe/Berlin, UTC)")
        })?;
        Ok(Schedule {
            zone_name: zone.to_string(),
            tz,
            at,
        })
    }

    /// The report day `now` falls on.
    pub fn day_of(&self, now: Timestamp) -> Date {
        self.tz.to_datetime(now).date()
    }

    /// When the report of `day` is sent.
    pub fn send_at(&self, day: Date) -> anyhow::Result<Timestamp> {
        self.tz
            .to_timestamp(day.to_datetime(self.at))
            .with_context(|| format!("{day} {} in {}", self.at, self.zone_name))
    }

    /// What is due at `now`, given whether today's report is already done (sent, or claimed
    /// by a sender that never finished).
    pub fn next(&self, now: Timestamp, today_done: bool) -> anyhow::Result<Next> {
        let today = self.day_of(now);
        let at = self.send_at(today)?;
        if now < at {
            return Ok(Next::WaitUntil(at));
        }
        if !today_done {
            return Ok(Next::SendNow(today));
        }
        let tomorrow = today
            .tomorrow()
            .with_context(|| format!("the day after {today}"))?;
        Ok(Next::WaitUntil(self.send_at(tomorrow)?))
    }

    /// A time as the report shows it: local date, time and zone abbreviation.
    pub fn local(&self, ms: i64) -> String {
        match Timestamp::from_millisecond(ms) {
            Ok(ts) => ts
                .to_zoned_datetime(self.tz.clone())
                .strftime("%Y-%m-%d %H:%M %Z")
                .to_string(),
            Err(_) => format!("(invalid time {ms} ms)"),
        }
    }
}

fn parse_hh_mm(s: &str) -> Option<Time> {
    let (h, m) = s.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let h: i8 = h.parse().ok()?;
    let m: i8 = m.parse().ok()?;
    if !(0..24).contains(&h) || !(0..60).contains(&m) {
        return None;
    }
    Time::new(h, m, 0, 0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn berlin(time: &str) -> Schedule {
        Schedule::parse(time, "Europe/Berlin").expect("schedule")
    }

    #[test]
    fn parses_times_and_zones() {
        assert!(Schedule::parse("08:00", "UTC").is_ok());
        assert!(Schedule::parse("23:59", "America/New_York").is_ok());
        for bad in ["24:00", "8:00", "08:60", "08-00", "", "08:00:00", "-1:00"] {
            assert!(Schedule::parse(bad, "UTC").is_err(), "{bad}");
        }
        let err = Schedule::parse("08:00", "Europe/Atlantis").expect_err("unknown zone");
        assert!(format!("{err:#}").contains("IANA"));
    }

    #[test]
    fn ordinary_days() {
        let s = berlin("08:00");
        // Winter: CET is UTC+1.
        assert_eq!(
            s.send_at(date(2025, 1, 15)).expect("at"),
            ts("2025-01-15T07:00:00Z")
        );
        assert_eq!(
            s.next(ts("2025-01-15T06:59:59Z"), false).expect("next"),
            Next::WaitUntil(ts("2025-01-15T07:00:00Z"))
        );
        assert_eq!(
            s.next(ts("2025-01-15T07:00:00Z"), false).expect("next"),
            Next::SendNow(date(2025, 1, 15))
        );
        assert_eq!(
            s.next(ts("2025-01-15T07:00:00Z"), true).expect("next"),
            Next::WaitUntil(ts("2025-01-16T07:00:00Z"))
        );
        // 23:30 UTC on the 15th is already the 16th in Berlin: the 16th's report waits.
        assert_eq!(s.day_of(ts("2025-01-15T23:30:00Z")), date(2025, 1, 16));
        assert_eq!(
            s.next(ts("2025-01-15T23:30:00Z"), false).expect("next"),
            Next::WaitUntil(ts("2025-01-16T07:00:00Z"))
        );
    }

    #[test]
    fn spring_forward_gap() {
        // 2025-03-30 in Berlin: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
        let s = berlin("02:30");
        assert_eq!(
            s.send_at(date(2025, 3, 29)).expect("at"),
            ts("2025-03-29T01:30:00Z")
        );
        // Sent an hour "late" by the clock (03:30 CEST = 01:30 UTC), never skipped.
        assert_eq!(
            s.send_at(date(2025, 3, 30)).expect("at"),
            ts("2025-03-30T01:30:00Z")
        );
        assert_eq!(
            s.local(ts("2025-03-30T01:30:00Z").as_millisecond()),
            "2025-03-30 03:30 CEST"
        );
        assert_eq!(
            s.send_at(date(2025, 3, 31)).expect("at"),
            ts("2025-03-31T00:30:00Z")
        );
        // After the 29th's report: the next one is 24 h later (the gap shifts it), then 23 h.
        assert_eq!(
            s.next(ts("2025-03-29T02:00:00Z"), true).expect("next"),
            Next::WaitUntil(ts("2025-03-30T01:30:00Z"))
        );
        assert_eq!(
            s.next(ts("2025-03-30T01:30:00Z"), true).expect("next"),
            Next::WaitUntil(ts("2025-03-31T00:30:00Z"))
        );
        // An 08:00 schedule across the change: 23 hours apart.
        let s8 = berlin("08:00");
        let d = s8.send_at(date(2025, 3, 30)).expect("at").as_second()
            - s8.send_at(date(2025, 3, 29)).expect("at").as_second();
        assert_eq!(d, 23 * 3600);
    }

    #[test]
    fn fall_back_fold() {
        // 2025-10-26 in Berlin: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
        let s = berlin("02:30");
        // The first 02:30 (CEST, UTC+2) is the send instant...
        assert_eq!(
            s.send_at(date(2025, 10, 26)).expect("at"),
            ts("2025-10-26T00:30:00Z")
        );
        // ...and the second 02:30 (CET) an hour later does not send again that day.
        assert_eq!(
            s.next(ts("2025-10-26T01:30:00Z"), true).expect("next"),
            Next::WaitUntil(ts("2025-10-27T01:30:00Z"))
        );
        assert_eq!(s.day_of(ts("2025-10-26T01:30:00Z")), date(2025, 10, 26));
        // 08:00 across the change: 25 hours apart.
        let s8 = berlin("08:00");
        let d = s8.send_at(date(2025, 10, 26)).expect("at").as_second()
            - s8.send_at(date(2025, 10, 25)).expect("at").as_second();
        assert_eq!(d, 25 * 3600);
    }

    #[test]
    fn a_start_later_the_same_day_catches_up() {
        let s = Schedule::parse("06:00", "America/New_York").expect("schedule");
        // 2025-07-01 18:00 EDT: today's 06:00 report is due if it was not sent.
        assert_eq!(
            s.next(ts("2025-07-01T22:00:00Z"), false).expect("next"),
            Next::SendNow(date(2025, 7, 1))
        );
    }
}
