package redisbroker

// hubWaiters returns the number of reads waiting in b's hubs (for tests).
func (b *Broker) hubWaiters() int {
	b.hubsMu.Lock()
	defer b.hubsMu.Unlock()
	n := 0
	for _, h := range b.hubs {
		h.mu.Lock()
		n += len(h.waiters)
		h.mu.Unlock()
	}
	return n
}
