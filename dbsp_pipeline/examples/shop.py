"""The online-shop circuit used by the demo, the benchmark and the tests.

Inputs: ``orders`` and ``customers``. Views: revenue per region (filter, join, grouped sum/count/
max), the set of regions (distinct), and customers who never ordered (antijoin).
"""

from __future__ import annotations

import random
from typing import Any

from dbsp_pipeline.circuit import Circuit

ORDERS = "order_id BIGINT, customer_id BIGINT, amount DOUBLE"
CUSTOMERS = "customer_id BIGINT, region STRING"
REGIONS = ["north", "south", "east", "west", "center", "coast", "hills", "plains", "islands",
           "lakes"]


def shop_circuit(extra_views: bool = True) -> Circuit:
    c = Circuit("shop")
    orders = c.input("orders", ORDERS)
    customers = c.input("customers", CUSTOMERS)
    big = orders.filter("amount > 10")
    rev = (big.join(customers, on="customer_id")
           .group_by("region")
           .agg(total="sum(amount)", n="count(*)", top="max(amount)"))
    c.output("revenue_by_region", rev)
    if extra_views:
        c.output("regions", customers.select("region").distinct())
        c.output("idle_customers", customers.antijoin(orders, on="customer_id"))
    return c


class ShopData:
    """A reproducible stream of shop changes: new customers and orders, some orders cancelled."""

    def __init__(self, seed: int = 7, customers: int = 1000) -> None:
        self.rng = random.Random(seed)
        self.customer_count = customers
        self.next_order = 1
        self.live_orders: list[tuple[int, int, float]] = []

    def customers(self) -> list[tuple[int, str]]:
        return [(i, self.rng.choice(REGIONS)) for i in range(1, self.customer_count + 1)]

    def order_batch(self, n: int, delete_fraction: float = 0.1
                    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """``n`` changes: ``(inserts, deletes)`` with about ``delete_fraction`` deletions."""
        deletes = []
        n_del = min(len(self.live_orders), int(n * delete_fraction))
        for _ in range(n_del):
            i = self.rng.randrange(len(self.live_orders))
            self.live_orders[i], self.live_orders[-1] = self.live_orders[-1], self.live_orders[i]
            deletes.append(self.live_orders.pop())
        inserts = []
        for _ in range(n - n_del):
            row = (self.next_order, self.rng.randint(1, self.customer_count),
                   round(self.rng.uniform(1, 200), 2))
            self.next_order += 1
            inserts.append(row)
        self.live_orders.extend(inserts)
        return inserts, deletes
