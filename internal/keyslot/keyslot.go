// Package keyslot computes Redis Cluster hash slots, as CLUSTER KEYSLOT
// does, so that code can tell whether keys may meet in one script.
package keyslot

import "strings"

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// Of returns the hash slot of key: CRC16 (XMODEM) of its hash tag (the text
// between the first '{' and the next '}', when that is not empty) or else of
// the whole key, modulo Slots.
func Of(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % Slots
}
