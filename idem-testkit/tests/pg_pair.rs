//! The replicated pair of `idem_testkit::pg_replica`: a commit on the
//! primary survives its crash on the promoted standby, twice (there and
//! back), and the multi-host URL finds the primary each time.

use idem_testkit::pg::PgServer;
use idem_testkit::pg_replica::PgPair;

#[test]
fn commits_survive_two_failovers_and_the_url_follows_the_primary() {
    let mut pair = PgPair::start().unwrap();
    assert!(pair.standby().is_some());
    let url = pair.create_database().unwrap();
    let db = PgServer::database_of(&url).to_string();
    let sql = |pair: &PgPair, sql: &str| pair.primary().psql(&db, sql).unwrap();
    sql(&pair, "CREATE TABLE t (n int)");
    sql(&pair, "INSERT INTO t VALUES (1)");
    for (round, slot) in [(2, 1), (3, 0)] {
        pair.stop_immediate().unwrap();
        pair.promote().unwrap();
        assert_eq!(pair.primary_slot(), slot);
        assert!(pair.standby().is_none());
        assert_eq!(
            sql(&pair, "SELECT count(*) FROM t").trim(),
            (round - 1).to_string(),
            "every acknowledged commit is on the promoted standby"
        );
        assert_eq!(
            psql_url(&pair.conninfo(&db), "SELECT pg_is_in_recovery()"),
            "f"
        );
        pair.rebuild_standby().unwrap();
        sql(&pair, &format!("INSERT INTO t VALUES ({round})"));
        assert_eq!(
            pair.standby()
                .unwrap()
                .psql(&db, "SELECT max(n) FROM t")
                .unwrap()
                .trim(),
            round.to_string(),
            "the new standby has it (synchronous)"
        );
    }
}

/// `sql` through libpq's own reading of the multi-host connection string: the read-write
/// server of the two.
fn psql_url(url: &str, sql: &str) -> String {
    let psql = idem_testkit::pg::bin_dir().unwrap().join("psql");
    let out = std::process::Command::new(psql)
        .args(["-X", "-A", "-t", "-c", sql, url])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
