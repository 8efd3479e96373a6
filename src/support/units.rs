//! Sizes, rates and durations: parsed once, where the command line is read (clap's value
//! parsers use the `FromStr` impls here, so a bad value's error names its flag), then
//! passed down as typed values. `Display` writes them back in a form that parses to
//! the same value (`4M`, `300ms`), for messages, `reseq status` and resume records.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A number of bytes, written with binary units (`4096`, `512K`, `8M`, `1G`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct Size(pub u64);

impl Size {
    pub(crate) const fn mib(n: u64) -> Size {
        Size(n << 20)
    }

    pub(crate) const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Size, String> {
        parse_size(s).map(Size)
    }
}

impl fmt::Display for Size {
    /// The largest binary unit that divides it exactly: `4M`, `1536K`, `4097`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
            if self.0 != 0 && self.0.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", self.0 >> shift);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// A positive rate in bytes per second: `100M` or `100M/s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Rate(pub u64);

impl Rate {
    pub(crate) const fn bytes_per_second(self) -> u64 {
        self.0
    }
}

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Rate, String> {
        match parse_size(s.trim().trim_end_matches("/s"))? {
            0 => Err("must be positive".into()),
            v => Ok(Rate(v)),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Size(self.0))
    }
}

/// A duration written back so that [`parse_duration`] reads the same value: `5s`,
/// `300ms`, `1500ms`, `250us`.
pub(crate) fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    match ns {
        0 => "0s".into(),
        n if n % 1_000_000_000 == 0 => format!("{}s", n / 1_000_000_000),
        n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

/// Serde as text (`"4M"`, `"300ms"`): the form resume records have always had.
pub(crate) mod as_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<T: std::fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub(crate) fn deserialize<'de, T: std::str::FromStr<Err = String>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// [`as_text`] for an optional value (`null` when absent).
pub(crate) mod opt_as_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<T: std::fmt::Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, T: std::str::FromStr<Err = String>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        Option::<String>::deserialize(d)?.map(|t| t.parse().map_err(serde::de::Error::custom)).transpose()
    }
}

/// Durations as text (`"300ms"`), for serde.
pub(crate) mod duration_as_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(crate) fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*v))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::parse_duration(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Optional durations as text (`null` when absent).
pub(crate) mod opt_duration_as_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(crate) fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&super::format_duration(*v)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| super::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Parses `8M`, `8MiB`, `512K`, `1G`, `4096`: binary units, as storage tools use them.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("'{text}' is not a size (examples: 4096, 512K, 8M, 1G)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!("unknown size unit '{other}' in '{text}' (use K, M, G or T)"));
        }
    };
    n.checked_mul(mult).ok_or_else(|| format!("size '{text}' is too large"))
}

/// Parses `5s`, `500ms`, `1m30s` (humantime), and a bare number as seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<f64>()
        && secs.is_finite()
        && secs >= 0.0
    {
        return Ok(Duration::from_secs_f64(secs));
    }
    humantime::parse_duration(t).map_err(|e| format!("'{text}' is not a duration ({e}; examples: 2s, 500ms)"))
}

/// `1.5 GiB`-style rendering for humans.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[i]) }
}

pub(crate) fn human_rate(bytes_per_second: f64) -> String {
    format!("{}/s", human_bytes(bytes_per_second.max(0.0) as u64))
}

/// A span of time for humans, in the unit that reads best: `0.8 s`, `4.2 min`, `3.1 h`,
/// `12 days`, `16 years` (a prediction's precision, not a clock's).
pub(crate) fn human_seconds(s: f64) -> String {
    const MINUTE: f64 = 60.0;
    const HOUR: f64 = 3600.0;
    const DAY: f64 = 86_400.0;
    const YEAR: f64 = 365.25 * DAY;
    match s.max(0.0) {
        s if s < 10.0 => format!("{s:.1} s"),
        s if s < 2.0 * MINUTE => format!("{s:.0} s"),
        s if s < 2.0 * HOUR => format!("{:.0} min", s / MINUTE),
        s if s < 2.0 * DAY => format!("{:.1} h", s / HOUR),
        s if s < YEAR => format!("{:.0} days", s / DAY),
        s if s < 10.0 * YEAR => format!("{:.1} years", s / YEAR),
        s => format!("{:.0} years", s / YEAR),
    }
}

/// Now, as RFC 3339 in whole seconds (UTC): the time stamps of reports, journals and
/// rescue files.
pub(crate) fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// The `q` quantile (0..=1) of `v`, nearest rank.
pub(crate) fn percentile(v: &[f64], q: f64) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len().max(1)) - 1;
    s.get(i).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("8M").unwrap(), 8 << 20);
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("8Q").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn typed_values_print_as_they_parse() {
        for t in ["4M", "1536K", "4097", "1G", "0"] {
            assert_eq!(t.parse::<Size>().unwrap().to_string(), t);
        }
        assert_eq!("4096".parse::<Size>().unwrap().to_string(), "4K");
        assert_eq!("100M/s".parse::<Rate>().unwrap(), "100M".parse::<Rate>().unwrap());
        assert_eq!("0".parse::<Rate>().unwrap_err(), "must be positive");
        for d in ["0s", "5s", "300ms", "1500ms", "250us"] {
            assert_eq!(format_duration(parse_duration(d).unwrap()), d);
        }
        assert_eq!(format_duration(parse_duration("0.3s").unwrap()), "300ms");
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_seconds(0.84), "0.8 s");
        assert_eq!(human_seconds(95.0), "95 s");
        assert_eq!(human_seconds(600.0), "10 min");
        assert_eq!(human_seconds(5.0 * 3600.0), "5.0 h");
        assert_eq!(human_seconds(3.0 * 86_400.0), "3 days");
        assert_eq!(human_seconds(503e6), "16 years");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
