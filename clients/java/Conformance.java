// The client conformance scenario with the PostgreSQL JDBC driver (pgjdbc).
//
// Connects to PGHOST, PGPORT, PGDATABASE as IDEM_APP_USER (two connections)
// and IDEM_WORKER_USER.  pgjdbc sends setString() as varchar, which no
// function taking jsonb accepts: the first connection passes JSON with
// setObject(i, json, Types.OTHER) under default settings, the second sets
// stringtype=unspecified and passes JSON with setString().  Prints one line
// per step and "jdbc: N passed, M failed".  IDEM_PGBOUNCER=1: connected
// through PgBouncer in transaction mode (prepareThreshold=0).

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.UUID;

public class Conformance {
    static final String DRIVER = "jdbc";
    static final String SCOPE = "orders";
    static final String KEY = "order-1001";
    static final String ORDER = "{\"item\": \"book\", \"amount\": 12.5, \"currency\": \"EUR\"}";
    static final String RESERVE = "SELECT * FROM idem_reserve(?, ?, ?, ?)";

    static int passed = 0;
    static int failed = 0;

    interface Step {
        void run() throws Exception;
    }

    static void step(String name, Step fn) {
        try {
            fn.run();
            passed++;
            System.out.println("ok - " + name);
        } catch (SQLException e) {
            failed++;
            System.out.println("not ok - " + name + ": " + e.getSQLState() + " " + e.getMessage());
        } catch (Exception e) {
            failed++;
            System.out.println("not ok - " + name + ": " + e);
        }
    }

    static void expect(boolean cond, Object what) {
        if (!cond) {
            throw new AssertionError("unexpected: " + what);
        }
    }

    static Connection connect(String user, boolean unspecified) throws SQLException {
        String url = String.format("jdbc:postgresql://%s:%s/%s",
                System.getenv("PGHOST"), System.getenv("PGPORT"), System.getenv("PGDATABASE"));
        Properties props = new Properties();
        props.setProperty("user", user);
        props.setProperty("ApplicationName", "conformance-jdbc");
        if (unspecified) {
            props.setProperty("stringtype", "unspecified");
        }
        if (System.getenv("IDEM_PGBOUNCER") != null) {
            // PgBouncer (transaction mode) before 1.21: no named statements
            props.setProperty("prepareThreshold", "0");
        }
        return DriverManager.getConnection(url, props);
    }

    static String describe(ResultSet rs) throws SQLException {
        StringBuilder sb = new StringBuilder("{");
        for (int i = 1; i <= rs.getMetaData().getColumnCount(); i++) {
            sb.append(rs.getMetaData().getColumnName(i)).append('=').append(rs.getString(i)).append(' ');
        }
        return sb.append('}').toString();
    }

    public static void main(String[] args) throws Exception {
        String tenant = "conformance-jdbc-" + ProcessHandle.current().pid() + "-"
                + System.currentTimeMillis() / 1000;
        try (Connection app = connect(System.getenv("IDEM_APP_USER"), false);
             Connection other = connect(System.getenv("IDEM_APP_USER"), true);
             Connection worker = connect(System.getenv("IDEM_WORKER_USER"), false)) {
            run(tenant, app, other, worker);
        } catch (SQLException e) {
            failed++;
            System.out.println("not ok - connection: " + e.getSQLState() + " " + e.getMessage());
        }
        System.out.println(DRIVER + ": " + passed + " passed, " + failed + " failed");
        System.exit(failed == 0 && passed > 0 ? 0 : 1);
    }

    static void run(String tenant, Connection app, Connection other, Connection worker) throws SQLException {
        step("reserve: created", () -> {
            app.setAutoCommit(false);
            try (PreparedStatement ps = app.prepareStatement(RESERVE)) {
                ps.setString(1, tenant);
                ps.setString(2, SCOPE);
                ps.setString(3, KEY);
                ps.setObject(4, ORDER, Types.OTHER);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    expect(rs.getString("outcome").equals("created")
                            && rs.getObject("lock_token", UUID.class) != null
                            && rs.getObject("http_status") == null, describe(rs));
                }
            }
        });

        step("concurrent duplicate: in_progress, retry_after", () -> {
            try (PreparedStatement ps = other.prepareStatement(RESERVE)) {
                ps.setString(1, tenant);
                ps.setString(2, SCOPE);
                ps.setString(3, KEY);
                ps.setString(4, ORDER);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    expect(rs.getString("outcome").equals("in_progress")
                            && rs.getInt("http_status") == 409 && rs.getInt("retry_after") > 0,
                            describe(rs));
                }
            }
        });

        step("complete in the reserving transaction: succeeded", () -> {
            try (PreparedStatement ps = app.prepareStatement(
                    "SELECT idem_complete(?, ?, ?, ?, ?, ?)")) {
                ps.setString(1, tenant);
                ps.setString(2, SCOPE);
                ps.setString(3, KEY);
                ps.setInt(4, 201);
                ps.setObject(5, "{\"order_id\": 1001}", Types.OTHER);
                ps.setObject(6, "{\"Location\": \"/orders/1001\"}", Types.OTHER);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    String status = rs.getString(1);
                    app.commit();
                    expect("succeeded".equals(status), status);
                }
            } finally {
                app.rollback();   // a no-op after the commit
            }
        });

        step("replay, reordered and respaced body: stored response", () -> {
            try (PreparedStatement ps = other.prepareStatement(RESERVE)) {
                ps.setString(1, tenant);
                ps.setString(2, SCOPE);
                ps.setString(3, KEY);
                ps.setString(4, "{ \"currency\":\"EUR\" ,  \"amount\" : 12.50, \"item\":\"book\" }");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    // jsonb comes back in its normalised text form
                    expect(rs.getString("outcome").equals("replay")
                            && rs.getInt("http_status") == 201 && rs.getInt("response_code") == 201
                            && rs.getString("response_body").equals("{\"order_id\": 1001}")
                            && rs.getString("response_headers").equals("{\"Location\": \"/orders/1001\"}"),
                            describe(rs));
                }
            }
        });

        step("different body: mismatch", () -> {
            try (PreparedStatement ps = other.prepareStatement(RESERVE)) {
                ps.setString(1, tenant);
                ps.setString(2, SCOPE);
                ps.setString(3, KEY);
                ps.setString(4, "{\"item\": \"book\", \"amount\": 13, \"currency\": \"EUR\"}");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    expect(rs.getString("outcome").equals("mismatch")
                            && rs.getInt("http_status") == 422, describe(rs));
                }
            }
        });

        List<Long> ids = new ArrayList<>();
        step("outbox_enqueue with a reservation", () -> {
            try (PreparedStatement reserve = app.prepareStatement(
                         "SELECT outcome FROM idem_reserve(?, ?, ?, ?)");
                 PreparedStatement enqueue = app.prepareStatement(
                         "SELECT outbox_enqueue(?, ?, ?, key => ?, scope => ?)");
                 PreparedStatement complete = app.prepareStatement(
                         "SELECT idem_complete(?, ?, ?, ?, ?)")) {
                reserve.setString(1, tenant);
                reserve.setString(2, SCOPE);
                reserve.setString(3, "order-1002");
                reserve.setObject(4, ORDER, Types.OTHER);
                try (ResultSet rs = reserve.executeQuery()) {
                    rs.next();
                    expect(rs.getString(1).equals("created"), rs.getString(1));
                }
                for (int part = 1; part <= 2; part++) {
                    enqueue.setString(1, tenant);
                    enqueue.setString(2, "payment.capture");
                    enqueue.setObject(3, "{\"order\": 1002, \"part\": " + part + "}", Types.OTHER);
                    enqueue.setString(4, "order-1002");
                    enqueue.setString(5, SCOPE);
                    try (ResultSet rs = enqueue.executeQuery()) {
                        rs.next();
                        ids.add(rs.getLong(1));
                    }
                }
                complete.setString(1, tenant);
                complete.setString(2, SCOPE);
                complete.setString(3, "order-1002");
                complete.setInt(4, 201);
                complete.setObject(5, "{\"order_id\": 1002}", Types.OTHER);
                complete.executeQuery().close();
                app.commit();
            } finally {
                app.rollback();
            }
            expect(ids.size() == 2 && !ids.get(0).equals(ids.get(1)), ids);
        });

        List<Long> claimedIds = new ArrayList<>();
        List<UUID> leases = new ArrayList<>();
        step("outbox_claim as the worker", () -> {
            List<String> seen = new ArrayList<>();
            try (PreparedStatement ps = worker.prepareStatement(
                    "SELECT id, idem_key, payload, lease_token"
                    + " FROM outbox_claim(?, batch => 10, tenant => ?) ORDER BY id")) {
                ps.setString(1, "worker-jdbc");
                ps.setString(2, tenant);
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) {
                        claimedIds.add(rs.getLong("id"));
                        leases.add(rs.getObject("lease_token", UUID.class));
                        seen.add(describe(rs));
                        expect(rs.getString("idem_key").equals("order-1002"), describe(rs));
                    }
                }
            }
            expect(claimedIds.equals(ids) && !leases.contains(null), seen);
        });

        step("outbox_ack", () -> {
            try (PreparedStatement ps = worker.prepareStatement("SELECT outbox_ack(?, ?, ?, ?)")) {
                ps.setString(1, tenant);
                ps.setLong(2, claimedIds.get(0));
                ps.setObject(3, leases.get(0));
                ps.setString(4, "ref-1");
                ps.executeQuery().close();
            }
        });

        step("outbox_nack: pending", () -> {
            try (PreparedStatement ps = worker.prepareStatement("SELECT outbox_nack(?, ?, ?, ?)")) {
                ps.setString(1, tenant);
                ps.setLong(2, claimedIds.get(1));
                ps.setObject(3, leases.get(1));
                ps.setString(4, "HTTP 503");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    expect(rs.getString(1).equals("pending"), rs.getString(1));
                }
            }
        });

        // idem_execute's handler is a regproc: setObject(..., Types.OTHER),
        // or setString under stringtype=unspecified; a plain setString is
        // varchar, which regproc does not accept (42883)
        step("idem_execute, handler as Types.OTHER: created, then replay", () -> {
            String exec = "SELECT outcome, http_status, response_body FROM idem_execute(?, ?, ?, ?, ?)";
            for (String want : new String[] {"created", "replay"}) {
                try (PreparedStatement ps = app.prepareStatement(exec)) {
                    ps.setString(1, tenant);
                    ps.setString(2, SCOPE);
                    ps.setString(3, "order-exec");
                    ps.setObject(4, ORDER, Types.OTHER);
                    ps.setObject(5, "public.conformance_order", Types.OTHER);
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        String got = describe(rs);
                        app.commit();
                        expect(rs.getString("outcome").equals(want) && rs.getInt("http_status") == 201
                                && rs.getString("response_body").contains("order-exec"), got);
                    }
                }
            }
        });

        step("idem_execute, handler with setString: 42883; under stringtype=unspecified: replay", () -> {
            String exec = "SELECT outcome FROM idem_execute(?, ?, ?, ?, ?)";
            try (PreparedStatement ps = app.prepareStatement(exec)) {
                ps.setString(1, tenant);
                ps.setString(2, SCOPE);
                ps.setString(3, "order-exec");
                ps.setObject(4, ORDER, Types.OTHER);
                ps.setString(5, "public.conformance_order");
                ps.executeQuery().close();
                throw new AssertionError("no error");
            } catch (SQLException e) {
                app.rollback();
                expect("42883".equals(e.getSQLState()), e.getSQLState() + " " + e.getMessage());
            }
            try (PreparedStatement ps = other.prepareStatement(exec)) {
                ps.setString(1, tenant);
                ps.setString(2, SCOPE);
                ps.setString(3, "order-exec");
                ps.setString(4, ORDER);
                ps.setString(5, "public.conformance_order");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    expect(rs.getString("outcome").equals("replay"), describe(rs));
                }
            }
        });

        step("empty key: SQLSTATE 22004", () -> {
            try (PreparedStatement ps = other.prepareStatement(RESERVE)) {
                ps.setString(1, tenant);
                ps.setString(2, SCOPE);
                ps.setString(3, "");
                ps.setString(4, ORDER);
                ps.executeQuery().close();
                throw new AssertionError("no error");
            } catch (SQLException e) {
                expect("22004".equals(e.getSQLState()), e.getSQLState() + " " + e.getMessage());
            }
        });
    }
}
