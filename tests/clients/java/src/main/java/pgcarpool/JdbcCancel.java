package pgcarpool;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;

/**
 * pgjdbc's Statement.cancel() through a load balancer (tests/haproxy.rs): each round opens
 * a connection, runs pg_sleep(30) on it and cancels it from another thread once it runs
 * (pgjdbc sends the CancelRequest on a new connection to the same host and port, which the
 * balancer may give to another pgcarpool). Every query must end with SQLSTATE 57014 within
 * 5 s.
 *
 * <p>Usage: java -cp pgjdbc-client.jar pgcarpool.JdbcCancel host port user password db rounds
 * Prints {@code ok <n> cancels} and exits 0, or {@code FAIL: ...} and exits 1.
 */
public final class JdbcCancel {
    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: JdbcCancel host port user password db rounds");
            System.exit(2);
        }
        String url = "jdbc:postgresql://" + args[0] + ":" + args[1] + "/" + args[4];
        Properties props = new Properties();
        props.setProperty("user", args[2]);
        props.setProperty("password", args[3]);
        int rounds = Integer.parseInt(args[5]);
        int ok = 0;
        for (int r = 0; r < rounds; r++) {
            try (Connection c = DriverManager.getConnection(url, props);
                    Statement st = c.createStatement();
                    Statement probe = c.createStatement()) {
                Thread canceller = new Thread(() -> {
                    try {
                        // Let the query reach the server first.
                        Thread.sleep(500);
                        st.cancel();
                    } catch (Exception e) {
                        System.out.println("FAIL: round cancel: " + e);
                    }
                });
                long start = System.nanoTime();
                canceller.start();
                try {
                    st.execute("SELECT pg_sleep(30)");
                    System.out.println("FAIL: round " + r + ": the query was not cancelled");
                } catch (SQLException e) {
                    long ms = (System.nanoTime() - start) / 1_000_000;
                    if ("57014".equals(e.getSQLState()) && ms < 5000) {
                        ok++;
                    } else {
                        System.out.println("FAIL: round " + r + ": " + e.getSQLState() + " after "
                                + ms + " ms: " + e.getMessage());
                    }
                }
                canceller.join();
            }
        }
        if (ok == rounds) {
            System.out.println("ok " + ok + " cancels");
        } else {
            System.exit(1);
        }
    }
}
