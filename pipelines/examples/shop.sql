-- The demo's shop schema; docker-compose.yml loads it into its PostgreSQL at first start.
CREATE TYPE order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE customers (
    id bigint PRIMARY KEY, name text NOT NULL, email text, bio text,
    created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE products (
    id int PRIMARY KEY, name text NOT NULL, price numeric(10,2) NOT NULL, tags text[]);
CREATE TABLE orders (
    id bigint PRIMARY KEY, customer_id bigint NOT NULL, product_id int NOT NULL, qty int NOT NULL,
    status order_status NOT NULL DEFAULT 'new', ordered_at timestamptz NOT NULL DEFAULT now());
INSERT INTO customers (id, name, email, bio)
    SELECT g, 'customer ' || g, 'c' || g || '@example.com', CASE WHEN g % 100 = 0 THEN repeat(md5(g::text), 200) END
    FROM generate_series(1, 2000) g;
INSERT INTO products SELECT g,
    (ARRAY['oak', 'steel', 'red', 'linen', 'glass'])[1 + g % 5] || ' ' || (ARRAY['lamp', 'chair', 'desk', 'mug', 'shelf', 'clock', 'kettle'])[1 + g % 7] || ' ' || g,
    round((random() * 100 + 1)::numeric, 2), ARRAY['tag' || (g % 5), 'demo']
    FROM generate_series(1, 200) g;
INSERT INTO orders (id, customer_id, product_id, qty, status)
    SELECT g, 1 + g % 2000, 1 + g % 200, 1 + g % 5, (ARRAY['new','paid','shipped']::order_status[])[1 + g % 3]
    FROM generate_series(1, 10000) g;
