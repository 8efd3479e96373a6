//! A database's files that it writes all the time: named in a warning, with the option
//! that leaves them out.

use std::path::Path;

/// A database's files that it writes all the time (its redo and undo logs, binary and
/// relay logs, WAL, doublewrite buffer or temporary space), with the option that leaves
/// them out. Rewriting them freezes the very writes a commit waits for: an InnoDB redo
/// log in a 0.92 s window held a commit 910 ms; a binary log under `sync_binlog=1` is
/// fsynced at every commit as the redo log is.
pub(super) fn hot_kind(path: &Path) -> Option<(&'static str, &'static str)> {
    let name = path.file_name()?.to_str()?;
    let under = |dir: &str| path.parent().is_some_and(|p| p.components().any(|c| c.as_os_str() == dir));
    // `prefix` then one or more digits (and nothing else).
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix).is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    let log_of = |infix: &str| {
        name.contains(infix) && (name.ends_with(".index") || numbered(&name[..name.rfind('.').map_or(0, |i| i + 1)]))
    };
    Some(if name.starts_with("ib_logfile") || under("#innodb_redo") {
        ("InnoDB redo log", "--exclude 'ib_logfile*' --exclude '#innodb_redo'")
    } else if name == "ibtmp1" {
        ("InnoDB temporary tablespace", "--exclude ibtmp1")
    } else if name == "ibdata1" {
        ("InnoDB system tablespace (its doublewrite buffer is written at every page flush)", "--exclude ibdata1")
    } else if numbered("undo_") || numbered("undo") {
        ("InnoDB undo tablespace", "--exclude 'undo*'")
    } else if log_of("relay-bin.") {
        ("MariaDB/MySQL relay log", "--exclude '*relay-bin.*'")
    } else if log_of("-bin.") {
        ("MariaDB/MySQL binary log", "--exclude '*-bin.*'")
    } else if numbered("aria_log.") || name == "aria_log_control" {
        ("MariaDB Aria log", "--exclude 'aria_log*'")
    } else if under("pg_wal") || under("pg_xlog") {
        ("PostgreSQL WAL", "--exclude pg_wal")
    } else if ["pg_xact", "pg_clog", "pg_multixact", "pg_subtrans", "pg_commit_ts", "pg_serial", "pg_notify"]
        .iter()
        .any(|d| under(d))
    {
        // Backends write these pages themselves when the buffers are full, and
        // wait on it: a frozen page stalls the transaction that evicts it.
        (
            "PostgreSQL transaction status (SLRU) data",
            "--exclude pg_xact --exclude pg_multixact --exclude pg_subtrans --exclude pg_commit_ts --exclude pg_serial --exclude pg_notify",
        )
    } else if under("pg_stat_tmp") || under("pg_replslot") || under("pg_logical") || name == "pg_control" {
        (
            "PostgreSQL statistics, replication-slot or control state",
            "--exclude pg_stat_tmp --exclude pg_replslot --exclude pg_logical --exclude pg_control",
        )
    } else if name.ends_with("-wal") {
        ("SQLite write-ahead log", "--exclude '*-wal'")
    } else {
        return None;
    })
}

/// One warning per kind of hot database file among those planned (empty ones are not
/// rewritten): what they are, why it matters, and the option that leaves them out.
pub(super) fn hot_files<'a>(planned: impl IntoIterator<Item = &'a Path>) -> Vec<String> {
    let mut kinds: Vec<(&str, &str, Vec<&Path>)> = Vec::new();
    for p in planned {
        let Some((kind, hint)) = hot_kind(p) else { continue };
        if std::fs::metadata(p).is_ok_and(|m| m.len() == 0) {
            continue;
        }
        match kinds.iter_mut().find(|k| k.0 == kind) {
            Some(k) => k.2.push(p),
            None => kinds.push((kind, hint, vec![p])),
        }
    }
    kinds
        .into_iter()
        .map(|(kind, hint, paths)| {
            let more = if paths.len() > 1 { format!(" and {} more", paths.len() - 1) } else { String::new() };
            format!(
                "the {kind} is among the files ({}{more}): the database writes it all the time, and each of those writes waits while a window freezes it (a commit can wait for a whole window); leave it out with {hint}",
                paths[0].display()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_database_s_hot_files() {
        let kind = |p: &str| hot_kind(Path::new(p)).map(|k| k.0);
        assert_eq!(kind("/var/lib/mysql/ib_logfile0"), Some("InnoDB redo log"));
        assert_eq!(kind("/var/lib/mysql/#innodb_redo/#ib_redo10"), Some("InnoDB redo log"));
        assert_eq!(kind("/var/lib/mysql/ibtmp1"), Some("InnoDB temporary tablespace"));
        assert_eq!(kind("/srv/pg/15/main/pg_wal/000000010000000000000001"), Some("PostgreSQL WAL"));
        assert_eq!(kind("/srv/app/db.sqlite-wal"), Some("SQLite write-ahead log"));
        assert_eq!(kind("/var/lib/mysql/ibdata1").map(|k| k.starts_with("InnoDB system")), Some(true));
        assert_eq!(kind("/var/lib/mysql/undo_001"), Some("InnoDB undo tablespace"));
        assert_eq!(kind("/var/lib/mysql/undo002"), Some("InnoDB undo tablespace"));
        assert_eq!(kind("/var/lib/mysql/mysql-bin.000042"), Some("MariaDB/MySQL binary log"));
        assert_eq!(kind("/var/lib/mysql/db1-bin.index"), Some("MariaDB/MySQL binary log"));
        assert_eq!(kind("/var/lib/mysql/db1-relay-bin.000007"), Some("MariaDB/MySQL relay log"));
        assert_eq!(kind("/var/lib/mysql/aria_log.00000001"), Some("MariaDB Aria log"));
        assert_eq!(kind("/var/lib/mysql/aria_log_control"), Some("MariaDB Aria log"));
        assert_eq!(kind("/var/lib/mysql/shop/orders.ibd"), None);
        assert_eq!(kind("/var/lib/mysql/undo_log_notes.txt"), None);
        assert_eq!(kind("/srv/data/my-bin.tar"), None, "a -bin. file not numbered is not a binlog");
        assert_eq!(kind("/srv/pg/15/main/base/5/16384"), None);
        assert_eq!(kind("/srv/pg/15/main/pg_xact/0000"), Some("PostgreSQL transaction status (SLRU) data"));
        assert_eq!(
            kind("/srv/pg/15/main/pg_multixact/members/0000"),
            Some("PostgreSQL transaction status (SLRU) data")
        );
        let state = Some("PostgreSQL statistics, replication-slot or control state");
        assert_eq!(kind("/srv/pg/15/main/global/pg_control"), state);
        assert_eq!(kind("/srv/pg/15/main/pg_replslot/standby1/state"), state);
        assert_eq!(kind("/srv/pg/15/main/global/1262"), None);
    }

    #[test]
    fn one_warning_per_kind_naming_the_first_file_and_how_many_more() {
        let dir = tempfile::tempdir().unwrap();
        let planned: Vec<std::path::PathBuf> = ["ib_logfile0", "ib_logfile1", "ibtmp1", "empty-wal", "t1.ibd"]
            .iter()
            .map(|n| {
                let path = dir.path().join(n);
                std::fs::write(&path, if *n == "empty-wal" { &b""[..] } else { &b"x"[..] }).unwrap();
                path
            })
            .collect();
        let w = hot_files(planned.iter().map(|p| p.as_path()));
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("InnoDB redo log") && w[0].contains("ib_logfile0 and 1 more"), "{}", w[0]);
        assert!(w[1].contains("--exclude ibtmp1"), "{}", w[1]);
    }
}
