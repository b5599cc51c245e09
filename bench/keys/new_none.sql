BEGIN;
INSERT INTO orders (customer, amount) VALUES ('cus_42', 19.99);
INSERT INTO events (topic, payload) VALUES ('order.created', '{"customer": "cus_42", "amount": 19.99}');
COMMIT;
