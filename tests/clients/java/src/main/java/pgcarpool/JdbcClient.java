package pgcarpool;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

/**
 * pgjdbc driver test for pgcarpool. Each worker thread has its own connection and keeps
 * its PreparedStatement objects for the whole run, so they are executed far past
 * prepareThreshold (5) and pgjdbc switches them to named server-side statements; other
 * statements are prepared afresh each time and come from pgjdbc's statement cache. The
 * mix runs in autocommit and in explicit transactions (setAutoCommit(false) ... commit or
 * rollback), with expected errors.
 *
 * <p>Usage: java -jar pgjdbc-client.jar host port user password db workers iterations
 */
public final class JdbcClient {
    static final String TABLE = "pgcarpool_driver_rows";
    static final AtomicLong QUERIES = new AtomicLong();

    static final class Mismatch extends Exception {
        Mismatch(String msg) {
            super(msg);
        }
    }

    static void check(boolean cond, String msg) throws Mismatch {
        if (!cond) {
            throw new Mismatch(msg);
        }
    }

    static void expectSqlState(PreparedStatement ps, String code, String what) throws Mismatch {
        try (ResultSet rs = ps.executeQuery()) {
            rs.next();
        } catch (SQLException e) {
            check(code.equals(e.getSQLState()),
                    what + ": expected SQLSTATE " + code + ", got " + e.getSQLState() + " (" + e.getMessage() + ")");
            QUERIES.incrementAndGet();
            return;
        }
        throw new Mismatch(what + ": expected SQLSTATE " + code + ", got success");
    }

    static final class Worker {
        final int w;
        final long run;
        final int iterations;
        final Connection conn;
        final PreparedStatement pair;
        final PreparedStatement count;
        final PreparedStatement insert;
        final PreparedStatement div;
        int inserted = 0;

        Worker(String url, Properties props, long run, int w, int iterations) throws SQLException {
            this.w = w;
            this.run = run;
            this.iterations = iterations;
            conn = DriverManager.getConnection(url, props);
            pair = conn.prepareStatement("select ?::int * 2, ?::text || 'x'");
            count = conn.prepareStatement("select count(*)::int from " + TABLE + " where run = ? and worker = ?");
            insert = conn.prepareStatement(
                    "insert into " + TABLE + " (driver, run, worker, iter, note) values (?, ?, ?, ?, ?)");
            div = conn.prepareStatement("select 10 / ?::int");
        }

        void checkPair(int a, String tag, String what) throws SQLException, Mismatch {
            pair.setInt(1, a);
            pair.setString(2, tag);
            try (ResultSet rs = pair.executeQuery()) {
                check(rs.next(), what + ": no row");
                int n = rs.getInt(1);
                String s = rs.getString(2);
                check(n == 2 * a && (tag + "x").equals(s),
                        what + ": got (" + n + ", " + s + "), want (" + 2 * a + ", " + tag + "x)");
            }
            QUERIES.incrementAndGet();
        }

        void countRows(int want, String what) throws SQLException, Mismatch {
            count.setLong(1, run);
            count.setInt(2, w);
            try (ResultSet rs = count.executeQuery()) {
                check(rs.next(), what + ": no row");
                int n = rs.getInt(1);
                check(n == want, what + ": row count " + n + ", want " + want);
            }
            QUERIES.incrementAndGet();
        }

        void insert(int i, String note) throws SQLException, Mismatch {
            insert.setString(1, "pgjdbc");
            insert.setLong(2, run);
            insert.setInt(3, w);
            insert.setInt(4, i);
            insert.setString(5, note);
            check(insert.executeUpdate() == 1, "insert: update count not 1");
            QUERIES.incrementAndGet();
        }

        void runAll() throws SQLException, Mismatch {
            String where = "worker " + w + " start";
            try {
                for (int i = 0; i < iterations; i++) {
                    int a = w * 100000 + i;
                    String tag = "w" + w + "-i" + i;
                    where = "worker " + w + " iteration " + i;
                    checkPair(a, tag, where + " pair");
                    // Distinct statements prepared afresh each time: pgjdbc's statement cache.
                    for (int k : new int[] {i % 10, (i * 7 + w + 3) % 10}) {
                        try (PreparedStatement ps = conn.prepareStatement("select ?::int + " + k)) {
                            ps.setInt(1, a);
                            try (ResultSet rs = ps.executeQuery()) {
                                check(rs.next(), where + " plus " + k + ": no row");
                                int v = rs.getInt(1);
                                check(v == a + k, where + " plus " + k + ": got " + v + ", want " + (a + k));
                            }
                        }
                        QUERIES.incrementAndGet();
                    }
                    if (i % 2 == 1) {
                        int n = i % 50 + 1;
                        try (PreparedStatement ps = conn.prepareStatement(
                                "select count(*)::int, coalesce(sum(g), 0)::int from generate_series(1, ?::int) g")) {
                            ps.setInt(1, n);
                            try (ResultSet rs = ps.executeQuery()) {
                                check(rs.next(), where + " series: no row");
                                int c = rs.getInt(1);
                                int s = rs.getInt(2);
                                check(c == n && s == n * (n + 1) / 2,
                                        where + " series: got (" + c + ", " + s + "), want (" + n + ", " + n * (n + 1) / 2 + ")");
                            }
                        }
                        QUERIES.incrementAndGet();
                    }
                    if (i % 3 == 0) {
                        conn.setAutoCommit(false);
                        insert(i, tag);
                        countRows(inserted + 1, where + " count in txn");
                        checkPair(a + 1, tag + "t", where + " pair in txn");
                        conn.commit();
                        conn.setAutoCommit(true);
                        inserted++;
                    }
                    if (i % 5 == 2) {
                        div.setInt(1, 0);
                        expectSqlState(div, "22012", where + " division by zero");
                    }
                    if (i % 10 == 7) {
                        conn.setAutoCommit(false);
                        insert(i, "rolled back");
                        div.setInt(1, 0);
                        expectSqlState(div, "22012", where + " division by zero in txn");
                        conn.rollback();
                        conn.setAutoCommit(true);
                        countRows(inserted, where + " count after rollback");
                    }
                }
                countRows(inserted, "worker " + w + " final count");
            } catch (SQLException e) {
                // An unexpected error: say where, with the SQLSTATE.
                throw new Mismatch(where + ": unexpected error (SQLSTATE " + e.getSQLState() + "): " + e.getMessage());
            } finally {
                conn.close();
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 7) {
            System.err.println("usage: java -jar pgjdbc-client.jar host port user password db workers iterations");
            System.exit(2);
        }
        String url = "jdbc:postgresql://" + args[0] + ":" + args[1] + "/" + args[4];
        Properties props = new Properties();
        props.setProperty("user", args[2]);
        props.setProperty("password", args[3]);
        props.setProperty("sslmode", "disable");
        int workers = Integer.parseInt(args[5]);
        int iterations = Integer.parseInt(args[6]);

        try (Connection setup = DriverManager.getConnection(url, props); Statement st = setup.createStatement()) {
            st.execute("create table if not exists " + TABLE
                    + " (driver text, run bigint, worker int, iter int, note text)");
        } catch (SQLException e) {
            if (!"23505".equals(e.getSQLState()) && !"42P07".equals(e.getSQLState())) {
                System.out.println("FAIL: setup: " + e);
                System.exit(1);
            }
        }

        long run = ThreadLocalRandom.current().nextLong(1, Long.MAX_VALUE);
        List<Thread> threads = new ArrayList<>();
        List<String> failures = java.util.Collections.synchronizedList(new ArrayList<>());
        for (int w = 0; w < workers; w++) {
            final int wn = w;
            Thread t = new Thread(() -> {
                try {
                    new Worker(url, props, run, wn, iterations).runAll();
                } catch (Mismatch e) {
                    failures.add(e.getMessage());
                } catch (Exception e) {
                    failures.add("worker " + wn + ": " + e);
                }
            });
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) {
            t.join();
        }
        if (!failures.isEmpty()) {
            for (String f : failures) {
                System.out.println("FAIL: " + f);
            }
            System.exit(1);
        }
        System.out.println("ok " + QUERIES.get() + " queries");
    }
}
