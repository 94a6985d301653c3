package ftoa

// The decimal exponents k that scale a float32's rounding interval (Giulietti §9.1):
// ⌊log10 2^qMin⌋ to ⌊log10 2^qMax⌋, qMax = 104.
const (
	kMin = -45
	kMax = 31
)

// tenToMinus[k-kMin] is the upper 63 bits of g, the 126-bit approximation from above of
// 10^-k (Giulietti §9.2.2): g = ⌊10^-k·2^-r⌋ + 1, r = ⌊log2 10^-k⌋ - 125. TestTenToMinusIsItsDefinition
// recomputes it.
var tenToMinus = [kMax - kMin + 1]uint64{
	0x59aedfc10d7279c5, // -45
	0x47bf19673df52e37, // -44
	0x72cb5bd86321e38c, // -43
	0x5bd5e313828182d6, // -42
	0x4977e8dc68679bdf, // -41
	0x758ca7c70d7292fe, // -40
	0x5e0a1fd271287598, // -39
	0x4b3b4ca85a86c47a, // -38
	0x785ee10d5da46d90, // -37
	0x604be73de4838ad9, // -36
	0x4d0985cb1d3608ae, // -35
	0x7b426fab61f00de3, // -34
	0x629b8c891b267182, // -33
	0x4ee2d6d415b85ace, // -32
	0x7e37be2022c0914b, // -31
	0x64f964e68233a76f, // -30
	0x50c783eb9b5c85f2, // -29
	0x409f9cbc7c4a04c2, // -28
	0x6765c793fa10079d, // -27
	0x52b7d2dcc80cd2e4, // -26
	0x422ca8b0a00a4250, // -25
	0x69e10de76676d080, // -24
	0x54b40b1f852bda00, // -23
	0x43c33c1937564800, // -22
	0x6c6b935b8bbd4000, // -21
	0x56bc75e2d6310000, // -20
	0x4563918244f40000, // -19
	0x6f05b59d3b200000, // -18
	0x58d15e1762800000, // -17
	0x470de4df82000000, // -16
	0x71afd498d0000000, // -15
	0x5af3107a40000000, // -14
	0x48c2739500000000, // -13
	0x746a528800000000, // -12
	0x5d21dba000000000, // -11
	0x4a817c8000000000, // -10
	0x7735940000000000, // -9
	0x5f5e100000000000, // -8
	0x4c4b400000000000, // -7
	0x7a12000000000000, // -6
	0x61a8000000000000, // -5
	0x4e20000000000000, // -4
	0x7d00000000000000, // -3
	0x6400000000000000, // -2
	0x5000000000000000, // -1
	0x4000000000000000, // 0
	0x6666666666666666, // 1
	0x51eb851eb851eb85, // 2
	0x4189374bc6a7ef9d, // 3
	0x68db8bac710cb295, // 4
	0x53e2d6238da3c211, // 5
	0x431bde82d7b634da, // 6
	0x6b5fca6af2bd215e, // 7
	0x55e63b88c230e77e, // 8
	0x44b82fa09b5a52cb, // 9
	0x6df37f675ef6eadf, // 10
	0x57f5ff85e592557f, // 11
	0x465e6604b7a84465, // 12
	0x709709a125da0709, // 13
	0x5a126e1a84ae6c07, // 14
	0x480ebe7b9d58566c, // 15
	0x734aca5f6226f0ad, // 16
	0x5c3bd5191b525a24, // 17
	0x49c97747490eae83, // 18
	0x760f253edb4ab0d2, // 19
	0x5e72843249088d75, // 20
	0x4b8ed0283a6d3df7, // 21
	0x78e480405d7b9658, // 22
	0x60b6cd004ac94513, // 23
	0x4d5f0a66a23a9da9, // 24
	0x7bcb43d769f762a8, // 25
	0x63090312bb2c4eed, // 26
	0x4f3a68dbc8f03f24, // 27
	0x7ec3daf941806506, // 28
	0x65697bfa9acd1d9f, // 29
	0x51212ffbaf0a7e18, // 30
	0x40e7599625a1fe7a, // 31
}
