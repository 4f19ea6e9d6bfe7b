-- The example shop's schema.
CREATE TABLE product (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL DEFAULT 'misc; unsorted',
    price REAL NOT NULL CHECK (price >= 0),
    stock INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE customer (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT UNIQUE,
    country TEXT
);

CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customer (id),
    placed_on TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'new'  /* new, paid, shipped; or cancelled */
);

CREATE TABLE order_item (
    order_id INTEGER NOT NULL REFERENCES orders (id),
    product_id INTEGER NOT NULL REFERENCES product (id),
    quantity INTEGER NOT NULL,
    unit_price REAL NOT NULL,
    PRIMARY KEY (order_id, product_id)
);

CREATE INDEX orders_by_customer ON orders (customer_id);

CREATE VIEW order_total AS
SELECT order_id, sum(quantity * unit_price) AS total
FROM order_item
GROUP BY order_id;
